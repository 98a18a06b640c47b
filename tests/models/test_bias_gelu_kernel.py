"""The fused bias + tanh-GELU Pallas kernels (Pallas' interpreter on CPU) against NumPy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_determinism import assert_repeatable_without_atomics

from jaxtrain.models import bias_gelu_kernel
from jaxtrain.models.bias_gelu_kernel import bias_gelu

# Against NumPy's tanh at 1e-5: XLA's unoptimized CPU code is less accurate in the tails.
pytestmark = pytest.mark.xla_optimized

# Rows over several backward programs, the last one partial; features over two column tiles,
# the second partial.
N = 2 * bias_gelu_kernel.BACKWARD_ROWS * bias_gelu_kernel.BACKWARD_GROUP + 5
F = bias_gelu_kernel.FORWARD_COLS + 88


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    pre = jnp.asarray(rng.standard_normal((N, F)) * 2, dtype)  # both tails of the GELU
    bias = jnp.asarray(rng.standard_normal(F) * 0.5, jnp.float32)
    dout = jnp.asarray(rng.standard_normal((N, F)), dtype)
    return pre, bias, dout


def _numpy(pre, bias, dout):
    """gelu_tanh(pre + bias) and the gradients of pre and bias, in float64 by the textbook formula."""
    z = np.asarray(pre, np.float64) + np.asarray(bias, np.float64)
    dout = np.asarray(dout, np.float64)
    k = math.sqrt(2 / math.pi)
    inner = k * (z + 0.044715 * z**3)
    t = np.tanh(inner)
    out = 0.5 * z * (1 + t)
    dz = dout * (0.5 * (1 + t) + 0.5 * z * (1 - t**2) * k * (1 + 3 * 0.044715 * z**2))
    return out, dz, dz.sum(0)


def _kernel(pre, bias, dout):
    out, vjp = jax.vjp(lambda p, b: bias_gelu(p, b, interpret=True), pre, bias)
    return (out, *vjp(dout))


@pytest.mark.parametrize('dtype, tol, sum_tol', [(jnp.float32, 1e-5, 1e-4), (jnp.bfloat16, 2**-7, 1e-3)])
def test_forward_and_gradients_match_numpy(dtype, tol, sum_tol):
    pre, bias, dout = _inputs(dtype)
    # Jitted: eagerly, each op around the interpreted kernels compiles on its own (bf16: the
    # program the repeatability test below runs, compiled once for both).
    out, dpre, dbias = jax.jit(_kernel)(pre, bias, dout)
    want_out, want_dpre, want_dbias = _numpy(pre, bias, dout)
    assert out.dtype == dpre.dtype == dtype and dbias.dtype == jnp.float32
    # one rounding to the model dtype, relative to values of order 1
    np.testing.assert_allclose(np.asarray(out, np.float64), want_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(dpre, np.float64), want_dpre, rtol=tol, atol=tol)
    # dbias: an fp32 sum of N unrounded products
    np.testing.assert_allclose(np.asarray(dbias), want_dbias, rtol=sum_tol, atol=sum_tol)


def test_matches_the_models_unfused_gelu():
    pre, bias, dout = _inputs(jnp.float32, seed=2)
    want = jax.nn.gelu(pre + bias, approximate=True)
    out = bias_gelu(pre.reshape(N, 1, F), bias, interpret=True)
    assert out.shape == (N, 1, F)
    np.testing.assert_allclose(np.asarray(out).reshape(N, F), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_twice_gives_the_same_bits_and_no_kernel_uses_atomics():
    # The bias gradient is per-program partial sums added in a fixed order: no atomic add
    # (whose order on a GPU varies from run to run) appears in either kernel.
    assert_repeatable_without_atomics(
        _kernel, _inputs(jnp.bfloat16, seed=1), ('bias_gelu_forward', 'bias_gelu_backward'), 'tanh'
    )
