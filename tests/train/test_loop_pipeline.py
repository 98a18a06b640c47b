"""The loop reads step n's metrics while step n+1 runs (train/loop.py): what a user sees
must not change. A step line's time is the wall clock between two steps, saves included;
a non-finite loss found one step late still stops the run before any save."""

import json

import pytest

from cli_runs import run_cli
from jaxtrain.checkpoint import layout as ckpt_layout
from trainer_runs import random_shard, tiny_llmc_model


def _files(tmp_path):
    shard, model = random_shard(tmp_path / 'train.bin'), tiny_llmc_model(tmp_path / 'model.bin')
    return ['--input_bin', shard, '--llmc_filepath', model]


def test_step_time_is_the_wall_clock_between_steps_saves_included(tmp_path):
    """Each step's record is written when the loop has its loss; the gap between two
    records is what a user waited for the later step. The first save (its compilation
    takes seconds on a CPU) falls inside one gap: that step's line must hold it too."""
    metrics = tmp_path / 'metrics'
    result = run_cli(
        *_files(tmp_path),
        '--num_iteration',
        6,
        '--save_steps',
        2,
        '--checkpoint_dir',
        tmp_path / 'ck',
        '--metrics_dir',
        metrics,
    )
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in (metrics / 'metrics.jsonl').read_text().splitlines()]
    steps = [r for r in rows if 'loss' in r]
    assert [r['step'] for r in steps] == [1, 2, 3, 4, 5, 6]
    blocked_ms = {r['step']: 1e3 * r['save_blocked_s'] for r in rows if 'save_blocked_s' in r}
    assert sorted(blocked_ms) == [2, 4, 6]
    # The save's device copy is dispatched before the loop waits for the step: its own figure.
    assert all(r['save_snapshot_s'] >= 0 for r in rows if 'save_blocked_s' in r)
    for before, after in zip(steps, steps[1:]):
        gap_ms = 1e3 * (after['time'] - before['time'])
        assert abs(after['step_ms'] - gap_ms) < 0.05 * gap_ms + 20, (after['step'], after['step_ms'], gap_ms)
    # The save after step 2 is inside step 3's time (the loop as it was left it out).
    assert steps[2]['step_ms'] >= blocked_ms[2]


@pytest.mark.slow
def test_non_finite_loss_found_one_step_late_is_never_saved(tmp_path):
    """Learning rate 1e30: step 1 is finite, step 2's loss is NaN. With saves every 3 steps,
    step 2 is read while step 3 runs, and the run stops before step 3 (whose predecessor's
    loss is NaN) is saved: nothing is committed."""
    root = tmp_path / 'ck'
    result = run_cli(
        *_files(tmp_path),
        '--learning_rate',
        1e30,
        '--num_iteration',
        5,
        '--save_steps',
        3,
        '--checkpoint_dir',
        root,
    )
    assert result.code == 1, result.err
    assert len(result.error_lines) == 1 and 'step 2: loss is nan' in result.error_lines[0], result.err
    assert 'there is no checkpoint of this run' in result.error_lines[0]
    assert ckpt_layout.committed_steps(root) == []


def test_a_non_finite_save_step_drops_its_snapshot(tmp_path):
    """Step 2 is a save step and its loss is NaN: the save's device copy is dispatched before
    the loop reads the loss (train/loop.py), and is dropped when the check stops the run."""
    root, metrics = tmp_path / 'ck', tmp_path / 'metrics'
    result = run_cli(
        *_files(tmp_path),
        '--learning_rate',
        1e30,
        '--num_iteration',
        5,
        '--save_steps',
        2,
        '--checkpoint_dir',
        root,
        '--metrics_dir',
        metrics,
    )
    assert result.code == 1, result.err
    assert len(result.error_lines) == 1 and 'step 2: loss is nan' in result.error_lines[0], result.err
    assert ckpt_layout.committed_steps(root) == [] and not any(root.glob('checkpoint_step_*'))
    rows = [json.loads(line) for line in (metrics / 'metrics.jsonl').read_text().splitlines()]
    assert not any('save_blocked_s' in r for r in rows)
