"""Residual add + LayerNorm, forward and backward, as Pallas (Triton) kernels.

Axis letters: N rows (tokens), C channels, P programs of the backward pass.

What it replaces: GPT-2's `s = x + r; y = LayerNorm(s)` (gpt2.py), which XLA runs as an add and
LayerNorm fusions forward, and as the LayerNorm backward, a residual add and the dscale/dbias
reductions backward. `add_layernorm` returns both the new residual stream s and y in one kernel
that reads x and r once; its backward reads s, dy and the residual's gradient ds once and writes
ds + dLN(dy) (the gradient of both x and r) once, with dscale/dbias partial sums per program.

Numerics follow the model's XLA form: s is rounded to x's dtype (the residual stream is kept
in the model dtype) and normalized in fp32 (statistics in fp32, as llm.c's kernels), with
eps 1e-5. The variance is the two-pass one (a row sits in registers), not flax's
E[x²] - E[x]²: more accurate, and within rounding of it. The backward is fp32 throughout and
rounds the residual gradient once.

Deterministic: no atomics. Each backward program owns a fixed range of rows and sums them in
order; the P partial sums are added by an XLA reduction, whose order is fixed too.

Only a single device's: XLA cannot split a Pallas call over a mesh (see attention.py), so
checks/fit_checks.py allows `--fused_kernels` on one device only.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

EPS = 1e-5  # GPT-2's (llm.c's) LayerNorm epsilon
# Rows per program and warps (module constants so that the GPU micro-benchmark can sweep them).
# A row of C channels is padded to a power of two (Triton's blocks must be): 768 -> 1024.
FORWARD_ROWS = 4
FORWARD_WARPS = 4
# The backward's programs each take BACKWARD_ROWS rows at a time, BACKWARD_GROUP times: fewer,
# longer programs mean fewer partial dscale/dbias rows to write and sum.
BACKWARD_ROWS = 4
BACKWARD_GROUP = 16
BACKWARD_WARPS = 4


def _default_interpret(interpret):
    return jax.default_backend() != 'gpu' if interpret is None else interpret


def _columns(C):
    """A row's column indices, padded to a power of two, and which of them are real."""
    cols = jnp.arange(pl.next_power_of_2(C))
    return cols, cols < C


def _forward_kernel(x_ref, r_ref, scale_ref, bias_ref, s_ref, y_ref, mean_ref, rstd_ref, *, rows: int):
    N, C = x_ref.shape
    row = pl.program_id(0) * rows + jnp.arange(rows)
    cols, col_ok = _columns(C)
    row_ok = row < N
    mask = row_ok[:, None] & col_ok[None, :]
    at = (row[:, None], cols[None, :])
    x = plgpu.load(x_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    r = plgpu.load(r_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    s = (x + r).astype(s_ref.dtype)  # the residual stream, in the model dtype as XLA keeps it
    plgpu.store(s_ref.at[at], s, mask=mask)
    s = s.astype(jnp.float32)  # padded lanes are 0: they add nothing to the sums
    mean = jnp.sum(s, axis=1) / C
    centered = jnp.where(mask, s - mean[:, None], 0.0)
    rstd = lax.rsqrt(jnp.sum(centered * centered, axis=1) / C + EPS)
    scale = plgpu.load(scale_ref.at[cols], mask=col_ok, other=0.0).astype(jnp.float32)
    bias = plgpu.load(bias_ref.at[cols], mask=col_ok, other=0.0).astype(jnp.float32)
    # flax's order: (s - mean) * (rstd * scale) + bias
    y = centered * (rstd[:, None] * scale[None, :]) + bias[None, :]
    plgpu.store(y_ref.at[at], y.astype(y_ref.dtype), mask=mask)
    plgpu.store(mean_ref.at[row], mean, mask=row_ok)
    plgpu.store(rstd_ref.at[row], rstd, mask=row_ok)


def _backward_kernel(
    s_ref, dy_ref, ds_ref, scale_ref, mean_ref, rstd_ref, dx_ref, dscale_ref, dbias_ref, *, rows, group
):
    N, C = s_ref.shape
    program = pl.program_id(0)
    cols, col_ok = _columns(C)
    scale = plgpu.load(scale_ref.at[cols], mask=col_ok, other=0.0).astype(jnp.float32)

    def body(i, sums):
        dscale, dbias = sums
        row = (program * group + i) * rows + jnp.arange(rows)
        row_ok = row < N
        mask = row_ok[:, None] & col_ok[None, :]
        at = (row[:, None], cols[None, :])
        s = plgpu.load(s_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
        dy = plgpu.load(dy_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
        ds = plgpu.load(ds_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
        mean = plgpu.load(mean_ref.at[row], mask=row_ok, other=0.0)
        rstd = plgpu.load(rstd_ref.at[row], mask=row_ok, other=0.0)
        xhat = jnp.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
        dxhat = dy * scale[None, :]
        # dLN = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), per row
        mean_dxhat = jnp.sum(dxhat, axis=1) / C
        mean_dxhat_xhat = jnp.sum(dxhat * xhat, axis=1) / C
        dln = (dxhat - mean_dxhat[:, None] - xhat * mean_dxhat_xhat[:, None]) * rstd[:, None]
        plgpu.store(dx_ref.at[at], (ds + dln).astype(dx_ref.dtype), mask=mask)
        # masked rows have dy = 0 and xhat = 0: they add nothing
        return dscale + jnp.sum(dy * xhat, axis=0), dbias + jnp.sum(dy, axis=0)

    width = cols.shape[0]
    start = (jnp.zeros((width,), jnp.float32), jnp.zeros((width,), jnp.float32))
    dscale, dbias = lax.fori_loop(0, group, body, start)
    flat = program * C + cols  # row `program` of the (P, C) partial sums
    plgpu.store(dscale_ref.at[flat], dscale, mask=col_ok)
    plgpu.store(dbias_ref.at[flat], dbias, mask=col_ok)


def _forward_call(x_NxC, r_NxC, scale_C, bias_C, interpret):
    N, C = x_NxC.shape
    return pl.pallas_call(
        functools.partial(_forward_kernel, rows=FORWARD_ROWS),
        out_shape=[
            jax.ShapeDtypeStruct((N, C), x_NxC.dtype),  # s
            jax.ShapeDtypeStruct((N, C), x_NxC.dtype),  # y
            jax.ShapeDtypeStruct((N,), jnp.float32),  # mean
            jax.ShapeDtypeStruct((N,), jnp.float32),  # 1 / std
        ],
        grid=(pl.cdiv(N, FORWARD_ROWS),),
        compiler_params=plgpu.CompilerParams(num_warps=FORWARD_WARPS),
        interpret=interpret,
        name='add_layernorm_forward',
    )(x_NxC, r_NxC, scale_C, bias_C)


def _backward_call(s_NxC, dy_NxC, ds_NxC, scale_C, mean_N, rstd_N, interpret):
    N, C = s_NxC.shape
    P = pl.cdiv(N, BACKWARD_ROWS * BACKWARD_GROUP)
    dx_NxC, dscale_PC, dbias_PC = pl.pallas_call(
        functools.partial(_backward_kernel, rows=BACKWARD_ROWS, group=BACKWARD_GROUP),
        out_shape=[
            jax.ShapeDtypeStruct((N, C), s_NxC.dtype),
            jax.ShapeDtypeStruct((P * C,), jnp.float32),
            jax.ShapeDtypeStruct((P * C,), jnp.float32),
        ],
        grid=(P,),
        compiler_params=plgpu.CompilerParams(num_warps=BACKWARD_WARPS),
        interpret=interpret,
        name='add_layernorm_backward',
    )(s_NxC, dy_NxC, ds_NxC, scale_C, mean_N, rstd_N)
    # XLA's reductions use no atomics: the P partials are added in the same order every run.
    return dx_NxC, dscale_PC.reshape(P, C).sum(0), dbias_PC.reshape(P, C).sum(0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def add_layernorm(x, r, scale, bias, interpret=None):
    """(s, y): s = x + r in x's dtype, y = LayerNorm(s) * scale + bias in x's dtype (fp32 inside).

    x, r: (..., C) of one dtype; scale, bias: (C,). interpret (default: off a GPU) runs the
    kernels through Pallas' interpreter, which is how the CPU tests check them.
    """
    return _forward(x, r, scale, bias, interpret)[0]


def _forward(x, r, scale, bias, interpret):
    interpret = _default_interpret(interpret)
    C = x.shape[-1]
    s, y, mean, rstd = _forward_call(x.reshape(-1, C), r.reshape(-1, C), scale, bias, interpret)
    return (s.reshape(x.shape), y.reshape(x.shape)), (s, scale, bias, mean, rstd)


def _backward(interpret, saved, grads):
    s_NxC, scale, bias, mean, rstd = saved
    ds, dy = grads
    C = s_NxC.shape[-1]
    dx, dscale, dbias = _backward_call(
        s_NxC,
        dy.reshape(-1, C),
        ds.reshape(-1, C),
        scale,
        mean,
        rstd,
        _default_interpret(interpret),
    )
    dx = dx.reshape(ds.shape)
    return dx, dx, dscale.astype(scale.dtype), dbias.astype(bias.dtype)


add_layernorm.defvjp(_forward, _backward)
