"""Megatron sequence parallelism (`--sequence_parallel`, InfiniTrain's flag; config key
`sequence_parallel`): between the tensor-parallel regions, the residual stream and the
norms that read it are split along T over the `tensor` axis instead of being held whole on
every tensor-parallel device.

The models mark those activations with `split_over_time(x_BxTxC)` (after each residual add,
and between blocks); the train step turns the marks on for its trace with
`activations_split(sharding)`. The compiler then replaces each row-parallel projection's
all-reduce by a reduce-scatter along T and gathers T back before the column-parallel ones,
so the per-device activation memory of those regions falls by the tensor size. Off (the
default) the marks are no-ops and the compiled step is unchanged.
"""

import contextlib

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtrain.parallel.mesh import BATCH_AXES, CONTEXT

_active: list = []  # the sharding of (B, T, C) activations while a step is traced


def time_split_sharding(mesh: Mesh) -> NamedSharding:
    """(B, T, C): B over the batch axes, T over tensor (within each context slice, with
    context parallelism: T over context × tensor), C whole."""
    time = (CONTEXT, 'tensor') if CONTEXT in mesh.shape else 'tensor'
    return NamedSharding(mesh, P(BATCH_AXES, time, None))


@contextlib.contextmanager
def activations_split(sharding: NamedSharding | None):
    """While tracing under this, split_over_time constrains to `sharding` (None: no-op)."""
    _active.append(sharding)
    try:
        yield
    finally:
        _active.pop()


def split_over_time(x_BxTxC):
    sharding = _active[-1] if _active else None
    if sharding is None:
        return x_BxTxC
    return jax.lax.with_sharding_constraint(x_BxTxC, sharding)
