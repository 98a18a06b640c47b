"""Softmax cross-entropy over rows of logits, with its gradient, as one Pallas (Triton) kernel.

Axis letters: N rows (tokens), V padded vocab.

What it replaces: vocab_table.py's XLA form reads each chunk of bf16 logits several times
(the max, the sum of exponentials, the target logit, the gradient) and writes the gradient
once. On an H200 at GPT-2 124M, batch 16 x 1024, those fusions took 2.9 ms of a 34 ms step.
Here, as llm.c's `fused_classifier_kernel3` does, one program
takes one row and computes loss = logsumexp - logit[target] and
dlogits = (softmax - onehot) * scale (in the logits' dtype), in two passes over the row's
blocks of columns:

1. an online softmax (running max and rescaled sum, per lane) that also picks out the
   target logit;
2. the gradient, written block by block.

Holding a whole GPT-2 row (50,304 columns) in registers instead, for one read, was slower
(register spills: 1.96 ms against 1.06 ms a chunk). Every sum has a fixed order (no atomics):
the kernel is deterministic. Columns from vocab_size on (GPT-2's padding) get probability 0
and gradient 0.

Only a single device's: XLA cannot split a Pallas call over a mesh (see attention.py), so
`resolve_cross_entropy` gives it to one-device GPU runs in bf16 and XLA's form to the rest.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

IMPLEMENTATIONS = ('auto', 'xla', 'pallas')
# Columns per iteration (a power of two, as Triton's blocks must be), warps per program and
# Triton's software-pipelining stages of the loop: the fastest combination timed on an H200 at
# GPT-2 124M's 16 x 1024 rows of 50304 logits.
BLOCK = 2048
NUM_WARPS = 8
NUM_STAGES = 3
# A finite "minus infinity": exp(NEG - NEG) would be nan with -inf.
_NEG = -1e30


def resolve_cross_entropy(requested: str, compute_dtype, num_devices: int = 1) -> str:
    """'auto' takes the Pallas kernel on one GPU in bf16/fp16, XLA's form everywhere else."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"cross_entropy: expected one of {', '.join(IMPLEMENTATIONS)}; found {requested!r}")
    half = jnp.dtype(compute_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    on_gpu = jax.default_backend() == 'gpu'
    if requested == 'auto':
        return 'pallas' if on_gpu and half and num_devices == 1 else 'xla'
    if requested == 'pallas' and not on_gpu:
        raise ValueError(
            f"cross_entropy: pallas needs a GPU; found backend {jax.default_backend()!r}. "
            "Use cross_entropy='xla'."
        )
    if requested == 'pallas' and num_devices > 1:
        raise ValueError(
            f"cross_entropy: pallas runs on one device only; found {num_devices}. Use cross_entropy='xla'."
        )
    return requested


def _row_kernel(logits_ref, target_ref, loss_ref, *dlogits_ref, vocab_size: int, scale: float):
    columns = logits_ref.shape[0]
    blocks = pl.cdiv(columns, BLOCK)
    target = target_ref[...]

    def load(i, eviction):
        cols = i * BLOCK + jnp.arange(BLOCK)
        x = plgpu.load(logits_ref.at[cols], mask=cols < columns, other=0.0, eviction_policy=eviction)
        return cols, x.astype(jnp.float32)

    def online(i, carry):
        max_lane, sum_lane, target_lane = carry
        cols, x = load(i, 'evict_last')  # kept in L2 for the second pass
        valid = cols < vocab_size
        new_max = jnp.maximum(max_lane, jnp.where(valid, x, _NEG))
        grown = jnp.where(valid, jnp.exp(x - new_max), 0.0)
        sum_lane = sum_lane * jnp.exp(max_lane - new_max) + grown
        target_lane = target_lane + jnp.where(cols == target, x, 0.0)
        return new_max, sum_lane, target_lane

    start = (
        jnp.full((BLOCK,), _NEG, jnp.float32),
        jnp.zeros((BLOCK,), jnp.float32),
        jnp.zeros((BLOCK,), jnp.float32),
    )
    max_lane, sum_lane, target_lane = lax.fori_loop(0, blocks, online, start)
    row_max = jnp.max(max_lane)
    lse = row_max + jnp.log(jnp.sum(sum_lane * jnp.exp(max_lane - row_max)))
    loss_ref[...] = lse - jnp.sum(target_lane)

    if dlogits_ref:
        (dlogits_ref,) = dlogits_ref

        @pl.loop(0, blocks)
        def _gradient(i):
            cols, x = load(i, 'evict_first')
            probs = jnp.where(cols < vocab_size, jnp.exp(x - lse), 0.0)
            grad = (probs - jnp.where(cols == target, 1.0, 0.0)) * scale
            plgpu.store(dlogits_ref.at[cols], grad.astype(dlogits_ref.dtype), mask=cols < columns)


def softmax_cross_entropy(
    logits_NxV, targets_N, vocab_size: int, scale: float, with_grads: bool, interpret=None
):
    """Per-row losses (fp32) and, with_grads, (softmax - onehot) * scale in the logits' dtype.

    interpret (default: off a GPU) runs the kernel through Pallas' interpreter, which is how
    the CPU tests check it.
    """
    if interpret is None:
        interpret = jax.default_backend() != 'gpu'
    N, V = logits_NxV.shape
    out_shape = [jax.ShapeDtypeStruct((), jnp.float32)]
    if with_grads:
        out_shape.append(jax.ShapeDtypeStruct((V,), logits_NxV.dtype))
    kernel = functools.partial(_row_kernel, vocab_size=vocab_size, scale=scale)
    row = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(),
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES),
        interpret=interpret,
        name='softmax_cross_entropy',
    )
    # vmap gives every row its own program (the batched grid axis).
    outputs = jax.vmap(row)(logits_NxV, targets_N.astype(jnp.int32))
    loss_N = outputs[0]
    return loss_N, (outputs[1] if with_grads else None)
