"""Token-embedding lookup whose gradient is a sorted segment sum, not a scatter-add.

Axis letters: N tokens (all of B·T), V vocabulary rows, C channels.

The gradient of `table[ids]` is a scatter-add of N rows into V. On a GPU, XLA runs that
with atomics, so the sum order (and the last bits) change from run to run; with
`--xla_gpu_deterministic_ops` it becomes a serial scatter costing 8.4 ms at 16k tokens
(ANCHORS.md), a sixth of a GPT-2 124M step. This backward is deterministic by
construction and cheap in either mode:

  1. a stable sort of the ids (the rows of each id become one contiguous segment, in
     token order),
  2. a segmented inclusive scan of the gradient rows in that order, a fixed tree of adds
     (jax.lax.associative_scan), so a segment's last row holds its sum,
  3. for every vocabulary row, a gather of its segment's last row (zero if absent).

No op in it is a scatter, so the result is bitwise the same on every run and every
backend setting. It costs about 0.4 ms more than the atomic scatter at that size, so runs
that need no determinism keep the scatter (`sorted_grad=False`).
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


def _segment_sum_by_sort(rows_NxC, ids_N, num_segments: int):
    """out[v] = sum of rows_NxC[i] over ids_N[i] == v, in fp32, deterministically."""
    order_N = jnp.argsort(ids_N, stable=True)
    sorted_ids_N = ids_N[order_N]
    sorted_rows_NxC = rows_NxC[order_N].astype(jnp.float32)
    starts_N = jnp.concatenate([jnp.ones((1,), bool), sorted_ids_N[1:] != sorted_ids_N[:-1]])

    def combine(left, right):
        left_start, left_sum = left
        right_start, right_sum = right
        # A segment start on the right cuts off everything on its left.
        return left_start | right_start, jnp.where(right_start[:, None], right_sum, left_sum + right_sum)

    _, running_NxC = jax.lax.associative_scan(combine, (starts_N, sorted_rows_NxC))
    # The last row of id v's segment sits just before the first id greater than v.
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
