"""The fused residual-add + LayerNorm Pallas kernels (Pallas' interpreter on CPU) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_determinism import assert_repeatable_without_atomics

from jaxtrain.models import layernorm_kernel
from jaxtrain.models.layernorm_kernel import EPS, add_layernorm

# Rows that end inside a forward tile and inside a backward program's group, over several
# backward programs (several partial dscale/dbias rows); channels not a power of two.
N, C = 2 * layernorm_kernel.BACKWARD_ROWS * layernorm_kernel.BACKWARD_GROUP + 7, 48


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C)) * 2 + 0.5  # a mean to remove
    r = rng.standard_normal((N, C))
    scale = 1 + 0.5 * rng.standard_normal(C)
    bias = rng.standard_normal(C)
    ds, dy = rng.standard_normal((N, C)), rng.standard_normal((N, C))
    low = [jnp.asarray(a, dtype) for a in (x, r, ds, dy)]
    return low[:2] + [jnp.asarray(scale, jnp.float32), jnp.asarray(bias, jnp.float32)] + low[2:]


def _numpy(x, r, scale, bias, ds, dy, dtype):
    """s, y and the gradients of both inputs, scale and bias, in float64 from the kernel's inputs."""
    f64 = [np.asarray(a, np.float64) for a in (x, r, scale, bias, ds, dy)]
    x, r, scale, bias, ds, dy = f64
    s = np.asarray(jnp.asarray(x + r, dtype), np.float64)  # the residual stream is in the model dtype
    mean = s.mean(1, keepdims=True)
    rstd = 1 / np.sqrt(((s - mean) ** 2).mean(1, keepdims=True) + EPS)
    xhat = (s - mean) * rstd
    y = xhat * scale + bias
    dxhat = dy * scale
    dln = rstd * (dxhat - dxhat.mean(1, keepdims=True) - xhat * (dxhat * xhat).mean(1, keepdims=True))
    return s, y, ds + dln, (dy * xhat).sum(0), dy.sum(0)


def _kernel(x, r, scale, bias, ds, dy):
    (s, y), vjp = jax.vjp(lambda *a: add_layernorm(*a, interpret=True), x, r, scale, bias)
    dx, dr, dscale, dbias = vjp((ds, dy))
    return s, y, dx, dr, dscale, dbias


# (dtype, tolerance of the outputs in the model dtype, of dscale/dbias (fp32 sums of N rows))
@pytest.mark.parametrize('dtype, tol, sum_tol', [(jnp.float32, 2e-5, 1e-4), (jnp.bfloat16, 2**-7, 1e-3)])
def test_forward_and_gradients_match_numpy(dtype, tol, sum_tol):
    inputs = _inputs(dtype)
    # Jitted: eagerly, each op around the interpreted kernels compiles on its own (bf16: the
    # program the repeatability test below runs, compiled once for both).
    s, y, dx, dr, dscale, dbias = jax.jit(_kernel)(*inputs)
    want_s, want_y, want_dx, want_dscale, want_dbias = _numpy(*inputs, dtype)
    for got in (s, y, dx, dr):
        assert got.dtype == dtype and got.shape == (N, C)
    assert dscale.dtype == dbias.dtype == jnp.float32
    # the outputs in the model dtype: within its rounding, relative to values of order 1
    close = dict(rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(s, np.float64), want_s, **close)
    np.testing.assert_allclose(np.asarray(y, np.float64), want_y, **close)
    np.testing.assert_allclose(np.asarray(dx, np.float64), want_dx, rtol=tol, atol=4 * tol)
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(dr))  # x + r: one gradient for both
    # dscale/dbias: fp32 sums of N products of inputs exact in the model dtype
    np.testing.assert_allclose(np.asarray(dscale), want_dscale, rtol=sum_tol, atol=sum_tol)
    np.testing.assert_allclose(np.asarray(dbias), want_dbias, rtol=sum_tol, atol=sum_tol)


def test_leading_axes_are_rows():
    x, r, scale, bias, _, _ = _inputs(jnp.float32)
    s, y = add_layernorm(x.reshape(N, 1, C), r.reshape(N, 1, C), scale, bias, interpret=True)
    want_s, want_y = add_layernorm(x, r, scale, bias, interpret=True)
    assert s.shape == y.shape == (N, 1, C)
    np.testing.assert_array_equal(np.asarray(y).reshape(N, C), np.asarray(want_y))


def test_twice_gives_the_same_bits_and_no_kernel_uses_atomics():
    # The reductions are per-program partial sums added in a fixed order: no atomic add
    # (whose order on a GPU varies from run to run) appears in either kernel.
    assert_repeatable_without_atomics(
        _kernel, _inputs(jnp.bfloat16, seed=1), ('add_layernorm_forward', 'add_layernorm_backward'), 'rsqrt'
    )
