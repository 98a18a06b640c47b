"""Bias add + tanh-GELU, forward and backward, as Pallas (Triton) kernels.

Axis letters: N rows (tokens), F features (GPT-2's 4C), P row groups of the backward pass.

What it replaces: GPT-2's MLP computes gelu_tanh(x @ W + b) (gpt2.py); XLA runs the bias add and
the GELU as a fusion forward, and the GELU derivative and the bias gradient (a column sum)
backward. Here the matmul is left without its bias, and one kernel reads its output once and
writes gelu(pre + b); the backward reads pre and the output gradient once, writes d(pre) and
per-program partial sums of the bias gradient.

Numerics: pre + b and the GELU are computed in fp32 (the bias is not rounded to the model
dtype first) and rounded once to pre's dtype; the derivative is gpt2.py's, in fp32, from the
same fp32 pre + b, so forward and backward agree on the point they differentiate at.

Deterministic: no atomics. Each backward program owns a fixed range of rows and sums them in
order; the P partial sums are added by an XLA reduction, whose order is fixed too. One device
only, as every Pallas kernel here (checks/fit_checks.py).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_CUBIC = 0.044715
# Tile sizes and warps (module constants so that the GPU micro-benchmark can sweep them); tiles
# are powers of two, as Triton's blocks must be, masked at the edges.
FORWARD_ROWS = 8
FORWARD_COLS = 512
FORWARD_WARPS = 4
# The backward's programs each take BACKWARD_ROWS rows at a time, BACKWARD_GROUP times: fewer,
# longer programs mean fewer partial bias-gradient rows to write and sum.
BACKWARD_ROWS = 8
BACKWARD_COLS = 512
BACKWARD_GROUP = 8
BACKWARD_WARPS = 4


def _default_interpret(interpret):
    return jax.default_backend() != 'gpu' if interpret is None else interpret


def _tile(ref, row0, rows, col0, cols):
    """Indices and mask of the (rows, cols) tile of an (N, F) ref starting at (row0, col0)."""
    N, F = ref.shape
    row = row0 + jnp.arange(rows)
    col = col0 + jnp.arange(cols)
    mask = (row < N)[:, None] & (col < F)[None, :]
    return (row[:, None], col[None, :]), col, mask


def _tanh_term(z):
    return jnp.tanh(_SQRT_2_OVER_PI * (z + _CUBIC * z * z * z))


def _forward_kernel(pre_ref, bias_ref, out_ref, *, rows: int, cols: int):
    at, col, mask = _tile(pre_ref, pl.program_id(0) * rows, rows, pl.program_id(1) * cols, cols)
    bias = plgpu.load(bias_ref.at[col], mask=col < pre_ref.shape[1], other=0.0).astype(jnp.float32)
    z = plgpu.load(pre_ref.at[at], mask=mask, other=0.0).astype(jnp.float32) + bias[None, :]
    out = 0.5 * z * (1 + _tanh_term(z))  # jax.nn.gelu(approximate=True)
    plgpu.store(out_ref.at[at], out.astype(out_ref.dtype), mask=mask)


def _backward_kernel(pre_ref, bias_ref, dout_ref, dpre_ref, dbias_ref, *, rows: int, cols: int, group: int):
    N, F = pre_ref.shape
    program, col0 = pl.program_id(0), pl.program_id(1) * cols
    col = col0 + jnp.arange(cols)
    bias = plgpu.load(bias_ref.at[col], mask=col < F, other=0.0).astype(jnp.float32)

    def body(i, dbias):
        at, _, mask = _tile(pre_ref, (program * group + i) * rows, rows, col0, cols)
        z = plgpu.load(pre_ref.at[at], mask=mask, other=0.0).astype(jnp.float32) + bias[None, :]
        dout = plgpu.load(dout_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
        t = _tanh_term(z)
        slope = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _CUBIC * z * z)
        dz = dout * slope  # 0 where masked: dout is
        plgpu.store(dpre_ref.at[at], dz.astype(dpre_ref.dtype), mask=mask)
        return dbias + jnp.sum(dz, axis=0)

    dbias = lax.fori_loop(0, group, body, jnp.zeros((cols,), jnp.float32))
    plgpu.store(dbias_ref.at[program * F + col], dbias, mask=col < F)  # row `program` of (P, F)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def bias_gelu(pre, bias, interpret=None):
    """gelu_tanh(pre + bias) in pre's dtype. pre: (..., F); bias: (F,).

    interpret (default: off a GPU) runs the kernels through Pallas' interpreter, which is how
    the CPU tests check them.
    """
    interpret = _default_interpret(interpret)
    F = pre.shape[-1]
    N = math.prod(pre.shape[:-1])
    # The tile sizes are bound here, not read inside the kernel: jax caches a kernel's trace.
    out = pl.pallas_call(
        functools.partial(_forward_kernel, rows=FORWARD_ROWS, cols=FORWARD_COLS),
        out_shape=jax.ShapeDtypeStruct((N, F), pre.dtype),
        grid=(pl.cdiv(N, FORWARD_ROWS), pl.cdiv(F, FORWARD_COLS)),
        compiler_params=plgpu.CompilerParams(num_warps=FORWARD_WARPS),
        interpret=interpret,
        name='bias_gelu_forward',
    )(pre.reshape(N, F), bias)
    return out.reshape(pre.shape)


def _forward(pre, bias, interpret):
    return bias_gelu(pre, bias, interpret), (pre, bias)


def _backward(interpret, saved, dout):
    pre, bias = saved
    F = pre.shape[-1]
    N = math.prod(pre.shape[:-1])
    P = pl.cdiv(N, BACKWARD_ROWS * BACKWARD_GROUP)
    dpre, dbias_PF = pl.pallas_call(
        functools.partial(_backward_kernel, rows=BACKWARD_ROWS, cols=BACKWARD_COLS, group=BACKWARD_GROUP),
        out_shape=[
            jax.ShapeDtypeStruct((N, F), pre.dtype),
            jax.ShapeDtypeStruct((P * F,), jnp.float32),
        ],
        grid=(P, pl.cdiv(F, BACKWARD_COLS)),
        compiler_params=plgpu.CompilerParams(num_warps=BACKWARD_WARPS),
        interpret=_default_interpret(interpret),
        name='bias_gelu_backward',
    )(pre.reshape(N, F), bias, dout.reshape(N, F))
    # XLA's reductions use no atomics: the P partials are added in the same order every run.
    return dpre.reshape(pre.shape), dbias_PF.reshape(P, F).sum(0).astype(bias.dtype)


bias_gelu.defvjp(_forward, _backward)
