"""How a step's tokens split into micro-steps and data-parallel ranks.

total_batch_size = batch_size × sequence_length × data_parallel × accumulation, as in
InfiniTrain, where data_parallel is the mesh's data × fsdp size (mesh.py; tensor-parallel
devices share their rows). A step always consumes the same contiguous `total_batch_size + 1`
token window of the stream (stream.py), whatever the device count: its rows are split first
over micro-steps, then over the data-parallel ranks, so `--batch_size 1 --total_batch_size
512` trains on the same tokens per step on 8, 4 or 1 device, with 8× more accumulation on 1.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class BatchGeometry:
    batch_size: int  # rows per data-parallel rank per micro-step
    sequence_length: int  # T
    data_parallel: int  # ranks the batch is split over (mesh data × fsdp)
    accumulation: int  # micro-steps per optimizer step

    @property
    def rows_per_micro_step(self) -> int:
        return self.batch_size * self.data_parallel

    @property
    def tokens_per_step(self) -> int:
        return self.rows_per_micro_step * self.sequence_length * self.accumulation


def batch_geometry(
    batch_size: int, sequence_length: int, total_batch_size: int, data_parallel: int
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
        batch_size, sequence_length, data_parallel, total_batch_size // tokens_per_micro_step
    )
