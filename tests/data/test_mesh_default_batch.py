"""The default total_batch_size on a mesh it cannot fill (README's
`launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4`: DP 8, one micro-step
of 4 x 64 x 8 = 2048 tokens against the default 256) becomes one micro-step, said in a
line; a total the user chose, or a default that one micro-step fits into, is kept."""

import pytest

from jaxtrain.data.stream import batch_geometry
from jaxtrain.data.stream import fit_default_total_to_mesh
from trainer_runs import load_config


def test_default_total_below_one_micro_step_becomes_one_micro_step(capsys):
    config = load_config('gpt2', 'tiny')
    assert config.total_batch_size == 256
    fit_default_total_to_mesh(config, data_parallel=8)
    assert config.total_batch_size == 4 * 64 * 8
    line = capsys.readouterr().out.strip()
    assert line == (
        'batch: total_batch_size 256 (the default) is less than one micro-step here (4 x 64 x DP 8 = 2048 '
        'tokens); using 2048 (no accumulation). Pass --total_batch_size to choose.'
    )
    geometry = batch_geometry(config.batch_size, config.sequence_length, config.total_batch_size, 8)
    assert (geometry.accumulation, geometry.tokens_per_step) == (1, 2048)


@pytest.mark.parametrize(
    'overrides, data_parallel',
    [
        ({}, 1),  # fits: one micro-step of 256
        ({}, 2),  # 4 x 64 x 2 = 512 > 256: one micro-step too
        ({'total_batch_size': 4096}, 8),  # a chosen total: kept
        ({'batch_size': 3}, 1),  # 192 < 256 and does not divide: still refused by batch_geometry
    ],
)
def test_otherwise_the_total_is_kept(overrides, data_parallel, capsys):
    config = load_config('gpt2', 'tiny', **overrides)
    before = config.total_batch_size
    micro_step = config.batch_size * config.sequence_length * data_parallel
    fit_default_total_to_mesh(config, data_parallel)
    if before == 256 and micro_step > 256:
        assert config.total_batch_size == micro_step  # the DP 2 case
    else:
        assert config.total_batch_size == before and capsys.readouterr().out == ''
