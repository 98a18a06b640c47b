"""The vocabulary table's two ends, each an op with a gradient written by hand: at the output,
the head and the cross-entropy as one op whose gradient is made in the forward pass
(lm_head_cross_entropy); at the input, the token-embedding lookup whose gradient is a sorted
segment sum, not a scatter-add (embedding_lookup).

Axis letters: B batch, T time, S time within a chunk, C channels, V padded vocab (Vp),
K chunks; for the loss kernel N rows (tokens); for the lookup, N tokens (all of B·T) and V
vocabulary rows.

The head and loss.

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
below) or 'pallas' (the kernel below, one fused pass per row; one GPU only).

The loss kernel (softmax_cross_entropy): softmax cross-entropy over N rows of logits, with its
gradient, as one Pallas (Triton) kernel. What it replaces: the XLA form above reads each chunk of
bf16 logits several times (the max, the sum of exponentials, the target logit, the gradient) and
writes the gradient once. On an H200 at GPT-2 124M, batch 16 x 1024, those fusions took 2.9 ms of a
34 ms step. Here, as llm.c's `fused_classifier_kernel3` does, one program takes one row and computes
loss = logsumexp - logit[target] and dlogits = (softmax - onehot) * scale (in the logits' dtype), in
two passes over the row's blocks of columns:

1. an online softmax (running max and rescaled sum, per lane) that also picks out the
   target logit;
2. the gradient, written block by block.

Holding a whole GPT-2 row (50,304 columns) in registers instead, for one read, was slower
(register spills: 1.96 ms against 1.06 ms a chunk). Every sum has a fixed order (no atomics):
the kernel is deterministic. Columns from vocab_size on (GPT-2's padding) get probability 0
and gradient 0.

Only a single device's: XLA cannot split a Pallas call over a mesh (see attention.py), so
`resolve_cross_entropy` gives it to one-device GPU runs in bf16 and XLA's form to the rest.

The lookup. The gradient of `table[ids]` is a scatter-add of N rows into V. On a GPU, XLA runs that
with atomics, so the sum order (and the last bits) change from run to run; with
`--xla_gpu_deterministic_ops` it becomes a serial scatter costing 8.4 ms at 16k tokens
on the GPU it was measured on, a sixth of a GPT-2 124M step. This backward is deterministic by
construction and cheap in either mode:

  1. a stable sort of the ids (the rows of each id become one contiguous segment, in
     token order),
  2. the running sum of each segment in that order, in a fixed order of adds (blocks of
     rows summed by a small 0/1 matmul, and a segmented scan across the blocks; see
     _segment_sum_by_sort), so a segment's last row holds its sum,
  3. for every vocabulary row, a gather of its segment's last row (zero if absent).

No op in it is a scatter, so the result is bitwise the same on every run and every
backend setting. It still costs more than the atomic scatter (a sort, and a pass over the
gradient rows; in blocks it took 0.25-0.5 ms off the deterministic GPT-2 124M step on an H200
that a plain segmented scan had cost), so runs that need no
determinism keep the scatter (`sorted_grad=False`).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# --- the loss kernel (Pallas) ---
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


# --- the head and loss ---

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
    loss_N, dlogits_NxV = softmax_cross_entropy(
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
    kernel: 'xla' or 'pallas' (resolve_cross_entropy picks one).
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


def embedding_lookup(table_VxC, ids, sorted_grad: bool = True):
    """table[ids], any ids shape; ids outside [0, V) are the caller's to rule out.

    sorted_grad: the deterministic sorted-segment-sum gradient, else autodiff's scatter-add.
    """
    if sorted_grad:
        return _lookup_sorted_grad(table_VxC, ids)
    return jnp.take(table_VxC, ids, axis=0)


@jax.custom_vjp
def _lookup_sorted_grad(table_VxC, ids):
    return jnp.take(table_VxC, ids, axis=0)


def _lookup_forward(table_VxC, ids):
    # The backward needs only the table's row count and dtype, which a zero-width slice
    # (V, 0) carries through the residuals without keeping the table alive.
    return _lookup_sorted_grad(table_VxC, ids), (ids, table_VxC[:, :0])


# Rows per block of the sorted gradient (see _segment_sum_by_sort).
SEGMENT_BLOCK = 64


def _segment_sum_by_sort(rows_NxC, ids_N, num_segments: int):
    """out[v] = sum of rows_NxC[i] over ids_N[i] == v, in fp32, deterministically.

    After a stable sort by id, the running sum of each id's rows is taken in blocks of
    SEGMENT_BLOCK (S) rows: within a block, one small matmul with a 0/1 matrix (row j adds into
    row i when j <= i and both hold the same id), at full fp32 precision; across blocks, a
    segmented scan of the R = N/S block tails carries an id's sum from block to block. The
    last row of each id's run then holds its sum. A plain segmented scan over all N rows
    made log2(N) passes over the gradient; this makes about one.
    """
    C, S = rows_NxC.shape[-1], SEGMENT_BLOCK
    order_N = jnp.argsort(ids_N, stable=True)
    sorted_ids_N = ids_N[order_N]
    sorted_rows_NxC = rows_NxC[order_N].astype(jnp.float32)
    N = ids_N.shape[0]
    pad = -N % S  # padding rows get an id past the vocabulary and zero rows: their own run
    ids_RxS = jnp.concatenate([sorted_ids_N, jnp.full((pad,), num_segments, ids_N.dtype)]).reshape(-1, S)
    rows_RxSxC = jnp.concatenate([sorted_rows_NxC, jnp.zeros((pad, C), jnp.float32)]).reshape(-1, S, C)

    # Within each block: running sums of each id's rows (ids are sorted, so a run is contiguous).
    lower_SxS = jnp.tril(jnp.ones((S, S), bool))
    same_RxSxS = (ids_RxS[:, :, None] == ids_RxS[:, None, :]) & lower_SxS
    running_RxSxC = jnp.einsum(
        'rij,rjc->ric', same_RxSxS.astype(jnp.float32), rows_RxSxC, precision=jax.lax.Precision.HIGHEST
    )

    # Across blocks: block q hands on its last id's sum (its tail), plus what it was handed
    # when the whole block is that id and the block before ended in it too.
    tail_ids_R = ids_RxS[:, -1]
    continues_R = jnp.concatenate([jnp.zeros((1,), bool), tail_ids_R[1:] == tail_ids_R[:-1]])
    continues_R &= ids_RxS[:, 0] == tail_ids_R

    def combine(left, right):
        left_continues, left_sum = left
        right_continues, right_sum = right
        return left_continues & right_continues, jnp.where(
            right_continues[:, None], left_sum + right_sum, right_sum
        )

    _, handed_on_RxC = jax.lax.associative_scan(combine, (continues_R, running_RxSxC[:, -1]))
    # What block r receives: the hand-on of block r-1 when it ended in r's first id.
    received_RxC = jnp.where((tail_ids_R[:-1] == ids_RxS[1:, 0])[:, None], handed_on_RxC[:-1], 0.0)
    received_RxC = jnp.concatenate([jnp.zeros((1, C), jnp.float32), received_RxC])
    first_run_RxS = ids_RxS == ids_RxS[:, :1]
    running_NxC = (running_RxSxC + jnp.where(first_run_RxS[:, :, None], received_RxC[:, None], 0.0)).reshape(
        -1, C
    )

    # The last row of id v's run sits just before the first id greater than v.
    ends_V = jnp.searchsorted(sorted_ids_N, jnp.arange(num_segments, dtype=ids_N.dtype), side='right')
    last_V = jnp.maximum(ends_V - 1, 0)
    present_V = (ends_V > 0) & (sorted_ids_N[last_V] == jnp.arange(num_segments, dtype=ids_N.dtype))
    return jnp.where(present_V[:, None], running_NxC[last_V], 0.0)


def _lookup_backward(residuals, d_out):
    ids, table_Vx0 = residuals
    C = d_out.shape[-1]
    d_table_VxC = _segment_sum_by_sort(d_out.reshape(-1, C), ids.reshape(-1), table_Vx0.shape[0])
    # Integer ids have no gradient; JAX wants a float0 zero in their place.
    return d_table_VxC.astype(table_Vx0.dtype), jnp.zeros(ids.shape, jax.dtypes.float0)


_lookup_sorted_grad.defvjp(_lookup_forward, _lookup_backward)
