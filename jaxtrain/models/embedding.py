"""Token-embedding lookup whose gradient is a sorted segment sum, not a scatter-add.

Axis letters: N tokens (all of B·T), V vocabulary rows, C channels.

The gradient of `table[ids]` is a scatter-add of N rows into V. On a GPU, XLA runs that
with atomics, so the sum order (and the last bits) change from run to run; with
`--xla_gpu_deterministic_ops` it becomes a serial scatter costing 8.4 ms at 16k tokens
(ANCHORS.md), a sixth of a GPT-2 124M step. This backward is deterministic by
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

import jax
import jax.numpy as jnp


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


def _forward(table_VxC, ids):
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


def _backward(residuals, d_out):
    ids, table_Vx0 = residuals
    C = d_out.shape[-1]
    d_table_VxC = _segment_sum_by_sort(d_out.reshape(-1, C), ids.reshape(-1), table_Vx0.shape[0])
    # Integer ids have no gradient; JAX wants a float0 zero in their place.
    return d_table_VxC.astype(table_Vx0.dtype), jnp.zeros(ids.shape, jax.dtypes.float0)


_lookup_sorted_grad.defvjp(_forward, _backward)
