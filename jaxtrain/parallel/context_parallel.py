"""Context parallelism (`--context_parallel C`, `--cp_comm_type`, InfiniTrain's flags from
branch feat/context_parallel, d03ba16): every sequence of the batch is cut along T into C
contiguous slices, one per device of the mesh axis `context` (sharding.py), as
SliceAlongCPRegionFunc (infini_train/src/nn/parallel/context_parallel.cc) cuts the inputs
and targets; no zigzag. Everything but attention works on its own tokens, so the compiler
keeps the activations split along T on its own (the batch arrives split so, sharding.py);
attention is the one place a token reads others, and it crosses the axis in a shard_map
that is manual over `context` only (data, fsdp and tensor stay with the compiler). The
pipeline's schedule (train/pipeline.py) is manual over `context` itself, because a
shard_map nested inside its rematerialised chunks does not lower (jax 0.11.2: the inner
region's residuals are sharded over the outer region's manual axis); there the blocks see
their own slice, and attention runs its program directly.

Axis letters: B batch, t a device's slice of T (T / C), N query heads, K key/value heads,
G = N / K query heads per key/value head, H head dim.

The three ways across, as d03ba16's --cp_comm_type names them:
  all_gather  every device gathers the whole K and V and attends its queries to them, the
              causal mask offset by its slice's start. The backward reduce-scatters dK, dV.
  p2p         a ring: C rounds, in round s a device holds the K/V slice of device r - s and
              passes it on with a ppermute; each round's partial attention is merged by the
              online softmax (running max, sum and output, as flash attention merges
              blocks). Rounds of a slice later than the queries are wholly masked and
              contribute nothing.
  a2a         Ulysses: an all-to-all trades the T split for a split over heads (each device
              then holds all T for N/C query and K/C key/value heads), the ordinary causal
              attention runs (attention.py's kernels, cuDNN's distinct calls included), and a
              second all-to-all trades back. Needs C to divide N and K.
all_gather and p2p compute their masked softmax in XLA ops (a flash kernel's causal mask
cannot be offset); fp32 scores, the output in the queries' dtype.
"""

import contextlib
import contextvars
import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxtrain.parallel.sharding import CONTEXT

COMM_TYPES = ('all_gather', 'p2p', 'a2a')
# Masked scores: a finite floor rather than -inf, so a round whose slice is wholly masked
# has a finite max and its terms vanish in the merge instead of turning into NaN.
_MASKED = -1e30


@dataclasses.dataclass(frozen=True)
class ContextSplit:
    mesh: Mesh
    comm_type: str

    @property
    def size(self) -> int:
        return self.mesh.shape[CONTEXT]


_ACTIVE = contextvars.ContextVar('jaxtrain_context_split', default=None)


@contextlib.contextmanager
def attention_across(split: ContextSplit | None):
    """While a step is traced under this, attention crosses the context axis (None: no-op)."""
    token = _ACTIVE.set(split)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> ContextSplit | None:
    return _ACTIVE.get()


def context_split(mesh: Mesh, comm_type: str) -> ContextSplit | None:
    """The split a run's steps trace under: None on a mesh without a context axis."""
    return ContextSplit(mesh, comm_type) if mesh.shape.get(CONTEXT, 1) > 1 else None


def _scores(q_BxtxNxH, k_BxsxKxH, q_start, k_start):
    """fp32 scores (B, K, G, t, s) scaled by 1/sqrt(H), causal by global position."""
    B, t, N, H = q_BxtxNxH.shape
    K = k_BxsxKxH.shape[2]
    q_BxtxKxGxH = q_BxtxNxH.reshape(B, t, K, N // K, H)
    s = jnp.einsum('btkgh,bskh->bkgts', q_BxtxKxGxH, k_BxsxKxH, preferred_element_type=jnp.float32)
    s = s * jnp.float32(1 / jnp.sqrt(jnp.float32(H)))
    q_pos = q_start + jnp.arange(t)
    k_pos = k_start + jnp.arange(k_BxsxKxH.shape[1])
    return jnp.where(k_pos[None, :] <= q_pos[:, None], s, _MASKED)


def _weighted_values(p_BxKxGxtxs, v_BxsxKxH):
    """(B, t, N, H) from the weights and the values, in fp32."""
    B, K, G, t, _ = p_BxKxGxtxs.shape
    out = jnp.einsum('bkgts,bskh->btkgh', p_BxKxGxtxs, v_BxsxKxH.astype(jnp.float32))
    return out.reshape(B, t, K * G, -1)


def _all_gather_attention(q, k, v, size):
    rank = jax.lax.axis_index(CONTEXT)
    t = q.shape[1]
    k_all = jax.lax.all_gather(k, CONTEXT, axis=1, tiled=True)
    v_all = jax.lax.all_gather(v, CONTEXT, axis=1, tiled=True)
    s = _scores(q, k_all, rank * t, 0)
    return _weighted_values(jax.nn.softmax(s, axis=-1), v_all).astype(q.dtype)


def _ring_attention(q, k, v, size):
    rank = jax.lax.axis_index(CONTEXT)
    t = q.shape[1]
    to_next = [(i, (i + 1) % size) for i in range(size)]
    running_max = running_sum = out = None
    for round_ in range(size):
        source = (rank - round_) % size  # whose slice of K and V this device holds now
        s = _scores(q, k, rank * t, source * t)
        # The max only keeps exp() in range; the result does not depend on it.
        block_max = jax.lax.stop_gradient(jnp.max(s, axis=-1))
        p = jnp.exp(s - block_max[..., None])
        block_sum = jnp.sum(p, axis=-1)
        block_out = _weighted_values(p, v)  # (B, t, N, H), unnormalised
        if out is None:  # the first ring step is the device's own slice: its diagonal is never masked
            running_max, running_sum, out = block_max, block_sum, block_out
        else:
            new_max = jnp.maximum(running_max, block_max)
            old_scale, block_scale = jnp.exp(running_max - new_max), jnp.exp(block_max - new_max)
            running_sum = running_sum * old_scale + block_sum * block_scale
            out = out * _per_query(old_scale) + block_out * _per_query(block_scale)
            running_max = new_max
        if round_ + 1 < size:
            k = jax.lax.ppermute(k, CONTEXT, to_next)
            v = jax.lax.ppermute(v, CONTEXT, to_next)
    return (out / _per_query(running_sum)).astype(q.dtype)


def _per_query(x_BxKxGxt):
    """(B, K, G, t) -> (B, t, N, 1), to scale the output's rows."""
    B, K, G, t = x_BxKxGxt.shape
    return jnp.moveaxis(x_BxKxGxt, 3, 1).reshape(B, t, K * G, 1)


def _ulysses_attention(q, k, v, size, local_attention):
    to_heads = lambda x: jax.lax.all_to_all(x, CONTEXT, split_axis=2, concat_axis=1, tiled=True)
    y_BxTxnxH = local_attention(to_heads(q), to_heads(k), to_heads(v))
    return jax.lax.all_to_all(y_BxTxnxH, CONTEXT, split_axis=1, concat_axis=2, tiled=True)


def attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, split: ContextSplit, local_attention):
    """Causal attention of the whole sequences, computed from T-split slices across the
    context axis by split.comm_type. `local_attention(q, k, v)` is the one-device causal
    attention a2a runs on whole sequences."""
    size = split.size
    if split.comm_type == 'a2a':
        program = lambda q, k, v: _ulysses_attention(q, k, v, size, local_attention)
    elif split.comm_type == 'p2p':
        program = lambda q, k, v: _ring_attention(q, k, v, size)
    elif split.comm_type == 'all_gather':
        program = lambda q, k, v: _all_gather_attention(q, k, v, size)
    else:
        raise ValueError(f"cp_comm_type: expected one of {', '.join(COMM_TYPES)}; found {split.comm_type!r}")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and CONTEXT in mesh.manual_axes:  # the pipeline's region: already per slice
        return program(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
    spec = P(None, CONTEXT)
    return jax.shard_map(
        program, mesh=split.mesh, in_specs=(spec, spec, spec), out_specs=spec, axis_names=frozenset({CONTEXT})
    )(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
