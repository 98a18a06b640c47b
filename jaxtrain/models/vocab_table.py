"""The output head and the cross-entropy as one op whose gradient is made in the forward pass.

Axis letters: B batch, T time, S time within a chunk, C channels, V padded vocab (Vp),
K chunks.

Written plainly (`logits = h @ W`, then `log_softmax` in fp32), XLA keeps a full fp32 copy
of the B·T·V logits alive for the backward pass and spends several passes over it: at
GPT-2 124M, batch 16 x 1024, that is 3.3 GB and about 5.5 ms of a 36 ms step on an H200.
Here, as llm.c's fused classifier does, the forward pass already knows
the loss is the last op, so it computes the gradient right away, chunk by chunk over T:

    logits = h @ W (compute dtype)   ->   loss, and dlogits = (softmax - onehot) / (B·T)
    dh = dlogits @ W^T,   dW += dlogits^T @ h (fp32)

and keeps only dh and dW for the backward pass, which scales them by the incoming
cotangent. No logits outlive their chunk; the three matmuls are the ones autodiff would
run. Padded vocabulary columns (GPT-2's V..Vp-1) get probability 0 and gradient 0.

`kernel` picks who turns a chunk of logits into its loss and dlogits: 'xla' (the jnp
below) or 'pallas' (cross_entropy_kernel.py, one fused pass per row; one GPU only).
"""

import functools

import jax
import jax.numpy as jnp

from jaxtrain.models import cross_entropy_kernel

# Largest logits chunk kept alive at once (per chunk, all rows, compute dtype).
_CHUNK_BYTES = 1 << 30


def num_chunks(rows: int, seq_len: int, vocab: int, itemsize: int) -> int:
    """Fewest chunks along T (a divisor of T) whose logits fit in _CHUNK_BYTES."""
    for k in range(1, seq_len + 1):
        if seq_len % k == 0 and rows * (seq_len // k) * vocab * itemsize <= _CHUNK_BYTES:
            return k
    return seq_len


def _logits(h_BxSxC, w, vocab_axis: int):
    """h @ W in the compute dtype of h; W is (V, C) (GPT-2's tied wte) or (C, V)."""
    return jax.lax.dot_general(h_BxSxC, w.astype(h_BxSxC.dtype), (((2,), (1 - vocab_axis,)), ((), ())))


def _xla_loss_and_dlogits(logits_BxSxV, targets_BxS, vocab_size: int, scale, with_grads: bool):
    """Sum of the chunk's losses and, with_grads, (softmax - onehot) * scale in the logits' dtype."""
    dtype = logits_BxSxV.dtype
    logits_BxSxV = logits_BxSxV.astype(jnp.float32)
    columns_V = jnp.arange(logits_BxSxV.shape[-1])
    if logits_BxSxV.shape[-1] > vocab_size:
        logits_BxSxV = jnp.where(columns_V < vocab_size, logits_BxSxV, -jnp.inf)
    is_target_BxSxV = columns_V == targets_BxS[..., None]
    max_BxS = jnp.max(logits_BxSxV, axis=-1)
    lse_BxS = max_BxS + jnp.log(jnp.sum(jnp.exp(logits_BxSxV - max_BxS[..., None]), axis=-1))
    target_logit_BxS = jnp.sum(jnp.where(is_target_BxSxV, logits_BxSxV, 0.0), axis=-1)
    loss_sum = jnp.sum(lse_BxS - target_logit_BxS)
    if not with_grads:
        return loss_sum, None
    probs_BxSxV = jnp.exp(logits_BxSxV - lse_BxS[..., None])
    return loss_sum, ((probs_BxSxV - is_target_BxSxV) * scale).astype(dtype)


def _pallas_loss_and_dlogits(logits_BxSxV, targets_BxS, vocab_size: int, scale, with_grads: bool):
    B, S, V = logits_BxSxV.shape
    loss_N, dlogits_NxV = cross_entropy_kernel.softmax_cross_entropy(
        logits_BxSxV.reshape(B * S, V), targets_BxS.reshape(B * S), vocab_size, scale, with_grads
    )
    return jnp.sum(loss_N), (dlogits_NxV.reshape(B, S, V) if with_grads else None)


_LOSS_AND_DLOGITS = {'xla': _xla_loss_and_dlogits, 'pallas': _pallas_loss_and_dlogits}


def _chunk(h_BxSxC, targets_BxS, w, vocab_size: int, vocab_axis: int, scale, with_grads: bool, kernel: str):
    """Sum of the chunk's losses and, with_grads, its dh and fp32 dW (already scaled)."""
    logits_BxSxV = _logits(h_BxSxC, w, vocab_axis)
    loss_sum, dlogits_BxSxV = _LOSS_AND_DLOGITS[kernel](
        logits_BxSxV, targets_BxS, vocab_size, scale, with_grads
    )
    if not with_grads:
        return loss_sum, None, None
    # dh in the compute dtype (as autodiff of the bf16 matmul gives); dW accumulated in fp32.
    dh_BxSxC = jax.lax.dot_general(dlogits_BxSxV, w.astype(h_BxSxC.dtype), (((2,), (vocab_axis,)), ((), ())))
    if vocab_axis == 0:
        dw = jnp.einsum('bsv,bsc->vc', dlogits_BxSxV, h_BxSxC, preferred_element_type=jnp.float32)
    else:
        dw = jnp.einsum('bsc,bsv->cv', h_BxSxC, dlogits_BxSxV, preferred_element_type=jnp.float32)
    return loss_sum, dh_BxSxC, dw


def _loss_and_grads(h_BxTxC, w, targets_BxT, vocab_size: int, vocab_axis: int, kernel: str, with_grads: bool):
    B, T, C = h_BxTxC.shape
    scale = 1.0 / (B * T)
    chunks = num_chunks(B, T, w.shape[vocab_axis], jnp.dtype(h_BxTxC.dtype).itemsize)
    step = functools.partial(
        _chunk,
        w=w,
        vocab_size=vocab_size,
        vocab_axis=vocab_axis,
        scale=scale,
        with_grads=with_grads,
        kernel=kernel,
    )
    if chunks == 1:
        loss_sum, dh_BxTxC, dw = step(h_BxTxC, targets_BxT)
        return loss_sum * scale, dh_BxTxC, dw

    # Chunks along T keep the batch axis (the data-parallel one) whole and in place.
    S = T // chunks
    h_KxBxSxC = jnp.moveaxis(h_BxTxC.reshape(B, chunks, S, C), 1, 0)
    targets_KxBxS = jnp.moveaxis(targets_BxT.reshape(B, chunks, S), 1, 0)

    def body(dw_sum, chunk):
        loss_sum, dh_BxSxC, dw = step(*chunk)
        if with_grads:
            dw_sum = dw_sum + dw
        return dw_sum, (loss_sum, dh_BxSxC)

    dw_init = jnp.zeros(w.shape, jnp.float32) if with_grads else None
    dw, (loss_sums_K, dh_KxBxSxC) = jax.lax.scan(body, dw_init, (h_KxBxSxC, targets_KxBxS))
    loss = jnp.sum(loss_sums_K) * scale
    if not with_grads:
        return loss, None, None
    return loss, jnp.moveaxis(dh_KxBxSxC, 0, 1).reshape(B, T, C), dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def lm_head_cross_entropy(h_BxTxC, w, targets_BxT, vocab_size: int, vocab_axis: int, kernel: str = 'xla'):
    """Mean next-token cross-entropy (fp32) of logits h @ W over the first vocab_size columns.

    h_BxTxC: final hidden states in the compute dtype. w: the head weight in its parameter
    dtype, (V, C) with vocab_axis=0 or (C, V) with vocab_axis=1. targets_BxT: int ids.
    kernel: 'xla' or 'pallas' (cross_entropy_kernel.resolve_cross_entropy picks one).
    """
    return _loss_and_grads(h_BxTxC, w, targets_BxT, vocab_size, vocab_axis, kernel, with_grads=False)[0]


def _forward(h_BxTxC, w, targets_BxT, vocab_size, vocab_axis, kernel):
    loss, dh_BxTxC, dw = _loss_and_grads(
        h_BxTxC, w, targets_BxT, vocab_size, vocab_axis, kernel, with_grads=True
    )
    return loss, (dh_BxTxC, dw.astype(w.dtype))


def _backward(vocab_size, vocab_axis, kernel, residuals, g):
    dh_BxTxC, dw = residuals
    # Integer targets have no gradient; JAX wants a float0 zero in their place.
    no_grad = jnp.zeros(dh_BxTxC.shape[:2], jax.dtypes.float0)
    return (g * dh_BxTxC).astype(dh_BxTxC.dtype), (g * dw).astype(dw.dtype), no_grad


lm_head_cross_entropy.defvjp(_forward, _backward)
