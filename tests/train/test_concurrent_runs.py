"""Two real trainer processes in one checkpoint_dir: the second, started while the first
has a save in flight, is refused in one line naming the first and touches nothing, so
every save of the first commits."""

import time

import pytest
from test_faults import logged_losses, trainers, unfinished  # noqa: F401  trainers is a fixture
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint import root_access as ownership
from jaxtrain.checkpoint.trainer_state import read_trainer_state
from jaxtrain.tools import ckpt as ckpt_tool

pytestmark = pytest.mark.slow


def test_second_run_is_refused_and_the_first_loses_nothing(tmp_path, trainers):  # noqa: F811  (a fixture)
    shard, model = random_shard(tmp_path / 'train.bin'), tiny_llmc_model(tmp_path / 'model.bin')
    root = tmp_path / 'ck'
    common = ['--input_bin', shard, '--llmc_filepath', model, '--checkpoint_dir', root]
    common += ['--save_steps', 1, '--max_checkpoint_keep', 2, '--resume_from', 'latest']
    common += ['--num_iteration', 100_000]
    # Both import first: the first run saves every step, and every step it takes while the
    # second imports is CPU spent on nothing the test checks.
    first = trainers(
        *common, '--learning_rate', 1e-3, '--metrics_dir', tmp_path / 'a', release_file=tmp_path / 'go1'
    )
    second = trainers(*common, '--learning_rate', 5e-4, release_file=tmp_path / 'go')
    first.wait_ready()
    second.wait_ready()
    first.release()
    deadline = time.monotonic() + 300
    # Released while the first has a save in flight: the moment its manager's clean-up of
    # temporary directories used to delete the first's save.
    while not (layout.committed_steps(root) and unfinished(root)):
        assert first.process.poll() is None and time.monotonic() < deadline, first.output()[-3000:]
        time.sleep(0.001)
    second.release()
    assert second.wait() == 1, second.output()[-3000:]
    refusal = [line for line in second.output().splitlines() if line.strip()]
    assert len(refusal) == 1 and refusal[0].startswith('error: '), refusal
    assert f'pid {first.process.pid}' in refusal[0] and ownership.LOCK_FILE in refusal[0], refusal
    assert first.process.poll() is None, 'the first run ended before the second was refused'
    first.process.terminate()  # SIGTERM: it saves its current step and stops
    assert first.wait() == 0, first.output()[-3000:]
    steps = layout.committed_steps(root)
    last = max(step for step, _ in logged_losses(tmp_path / 'a' / 'metrics.jsonl'))
    assert steps[-1] == last and len(steps) == 2, (steps, last)
    for step in steps:
        step_dir = root / layout.step_dir_name(step)
        assert ckpt_tool.main(['verify', str(step_dir)]) == 0
        assert read_trainer_state(step_dir)['training_config']['learning_rate'] == 1e-3
    assert not (root / ownership.LOCK_FILE).exists() and unfinished(root) == []
