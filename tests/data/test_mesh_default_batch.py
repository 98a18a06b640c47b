"""The default total_batch_size on a mesh it cannot fill (README's
`launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4`: DP 8, one micro-step
of 4 x 64 x 8 = 2048 tokens against the default 256) becomes one micro-step, said in a
line; a total the user chose, or a default that one micro-step fits into, is kept. The config
is never changed: the run's geometry and its record carry the total it uses."""

import pytest

from jaxtrain.checkpoint.trainer_state import compare_with_run, run_training_config
from jaxtrain.data.stream import announce_total_on_mesh, batch_geometry
from trainer_runs import load_config


def test_default_total_below_one_micro_step_becomes_one_micro_step(capsys):
    config = load_config('gpt2', 'tiny')
    assert config.total_batch_size == 256
    total = announce_total_on_mesh(config, data_parallel=8)
    assert total == 4 * 64 * 8
    assert config.total_batch_size == 256  # as given
    line = capsys.readouterr().out.strip()
    assert line == (
        'batch: total_batch_size 256 (the default) is less than one micro-step here (4 x 64 x DP 8 = 2048 '
        'tokens); using 2048 (no accumulation). Pass --total_batch_size to choose.'
    )
    geometry = batch_geometry(config.batch_size, config.sequence_length, total, 8)
    assert (geometry.accumulation, geometry.tokens_per_step) == (1, 2048)
    # What a record keeps and a resume compares is the total the run used.
    assert run_training_config(config, geometry.tokens_per_step)['total_batch_size'] == 2048


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
    total = announce_total_on_mesh(config, data_parallel)
    assert config.total_batch_size == before
    if before == 256 and micro_step > 256:
        assert total == micro_step  # the DP 2 case
    else:
        assert total == before and capsys.readouterr().out == ''


def test_a_record_of_one_micro_step_as_0_still_fits_the_same_run():
    """Records written before the geometry carried the total kept total_batch_size 0 (one
    micro-step, from --batch_size alone) beside their tokens_per_step: a resume with the same
    settings compares those tokens, and a run of another total is still refused."""
    config = load_config('gpt2', 'tiny', total_batch_size=0)
    saved = {'model_family': 'gpt2', 'training_config': config.to_dict(), 'tokens_per_step': 256}
    incompatible, _ = compare_with_run(saved, {}, run_training_config(config, 256))
    assert incompatible == []
    incompatible, _ = compare_with_run(saved, {}, run_training_config(config, 512))
    assert incompatible == ['total_batch_size: checkpoint 256, now 512']
