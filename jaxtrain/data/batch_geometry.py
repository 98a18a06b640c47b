"""How a step's tokens split into micro-steps and data-parallel ranks.

total_batch_size = batch_size × sequence_length × data_parallel × accumulation, as in
InfiniTrain, where data_parallel is the mesh's data × fsdp size (mesh.py; tensor-parallel
devices share their rows, and so do context-parallel ones: each takes a contiguous slice of
every row's T, as InfiniTrain's data loader is sharded by DP only). A step always consumes the
same contiguous `total_batch_size + 1` token window of the stream (stream.py), whatever the
device count: its rows are split first over micro-steps, then over the data-parallel ranks,
so `--batch_size 1 --total_batch_size 512` trains on the same tokens per step on 8, 4 or 1
device, with 8× more accumulation on 1.

The default total_batch_size on a mesh it cannot fill.

total_batch_size defaults to InfiniTrain's 256 tokens a step, which is one micro-step of
batch 4 x 64 on one device, but less than one micro-step on more data-parallel ranks
(`launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4` has 8: 2048 tokens).
There, and only there (a default smaller than one micro-step), a run that left
total_batch_size at its default gets one micro-step per step (no accumulation) and a line
saying so, instead of a refusal; a total the user chose is never changed
(batch_geometry.py refuses it when it does not divide).
"""

import dataclasses
import jax

from jaxtrain.config.keys import DEFAULT_TOTAL


@dataclasses.dataclass(frozen=True)
class BatchGeometry:
    batch_size: int  # rows per data-parallel rank per micro-step
    sequence_length: int  # T
    data_parallel: int  # ranks the batch is split over (mesh data × fsdp)
    accumulation: int  # micro-steps per optimizer step
    context: int = 1  # context-parallel slices of each row's T (mesh context; not in the token count)

    @property
    def rows_per_micro_step(self) -> int:
        return self.batch_size * self.data_parallel

    @property
    def tokens_per_step(self) -> int:
        return self.rows_per_micro_step * self.sequence_length * self.accumulation

    def describe(self) -> str:
        """'4 x 64 x DP 2 (data x fsdp) x accumulation 1 = 512 tokens/step', with
        ' (CP 2: 32 tokens a slice)' after the sequence length under context parallelism."""
        context = f' (CP {self.context}: {self.sequence_length // self.context} tokens a slice)'
        return (
            f'{self.batch_size} x {self.sequence_length}{context if self.context > 1 else ""} x DP '
            f'{self.data_parallel} (data x fsdp) x accumulation {self.accumulation} = '
            f'{self.tokens_per_step} tokens/step'
        )


def batch_geometry(
    batch_size: int, sequence_length: int, total_batch_size: int, data_parallel: int, context: int = 1
) -> BatchGeometry:
    """total_batch_size 0 means one micro-step: batch_size × sequence_length × data_parallel."""
    for key, value in (
        ('batch_size', batch_size),
        ('sequence_length', sequence_length),
    ):
        if value <= 0:
            raise ValueError(f'{key}: expected a positive integer, found {value}')
    if total_batch_size < 0:
        raise ValueError(
            f'total_batch_size: expected a positive integer (or 0: one micro-step), found {total_batch_size}'
        )
    tokens_per_micro_step = batch_size * sequence_length * data_parallel
    total_batch_size = total_batch_size or tokens_per_micro_step
    if total_batch_size % tokens_per_micro_step:
        raise ValueError(
            f'total_batch_size: expected a multiple of batch_size × sequence_length × data_parallel '
            f'(mesh data × fsdp) = '
            f'{batch_size} × {sequence_length} × {data_parallel} = {tokens_per_micro_step}; found '
            f'{total_batch_size}. Pass --total_batch_size {tokens_per_micro_step} (no accumulation) '
            'or a multiple of it, or change batch_size.'
        )
    return BatchGeometry(
        batch_size, sequence_length, data_parallel, total_batch_size // tokens_per_micro_step, context
    )


def total_on_mesh(config, data_parallel: int) -> int:
    """The total_batch_size the run uses on `data_parallel` ranks."""
    micro_step = config.batch_size * config.sequence_length * data_parallel
    # Only a default smaller than one micro-step: a batch_size that does not divide it is
    # still refused (the user chose that batch_size).
    if config.total_batch_size != DEFAULT_TOTAL or micro_step <= config.total_batch_size:
        return config.total_batch_size
    return micro_step


def fit_default_total_to_mesh(config, data_parallel: int) -> None:
    micro_step = total_on_mesh(config, data_parallel)
    if micro_step == config.total_batch_size:
        return
    config.total_batch_size = micro_step
    if jax.process_index() == 0:
        print(
            f'batch: total_batch_size {DEFAULT_TOTAL} (the default) is less than one micro-step '
            f'here ({config.batch_size} x {config.sequence_length} x DP {data_parallel} = {micro_step} '
            f'tokens); using {micro_step} (no accumulation). Pass --total_batch_size to choose.',
            flush=True,
        )
