"""The default total_batch_size on a mesh it cannot fill.

total_batch_size defaults to InfiniTrain's 256 tokens a step, which is one micro-step of
batch 4 x 64 on one device, but less than one micro-step on more data-parallel ranks
(`launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4` has 8: 2048 tokens).
There, and only there (a default smaller than one micro-step), a run that left
total_batch_size at its default gets one micro-step per step (no accumulation) and a line
saying so, instead of a refusal; a total the user chose is never changed
(batch_geometry.py refuses it when it does not divide).
"""

import jax

from jaxtrain.config.keys import DEFAULT_TOTAL


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
