"""bench/orbax_save_levers.py end to end on the CPU at the tiny model's size: the save commits, and
the steps after it and the thread samples from its start are reported (the copy settings it changes
act on a GPU only)."""

import json
import os
import subprocess
import sys

import pytest
from trainer_runs import REPO, random_shard

pytestmark = pytest.mark.slow  # a training run in a process of its own


def test_a_save_reports_its_figures_and_where_the_threads_were(tmp_path):
    shard = random_shard(tmp_path / 'train.bin')
    run = subprocess.run(
        [sys.executable, REPO / 'bench' / 'orbax_save_levers.py', tmp_path / 'out', '--input_bin', shard,
         '--config', 'configs/gpt2.py:tiny', '--batch_size', '2', '--sequence_length', '64',
         '--steps', '14', '--save_step', '10', '--host_gb', '0.0005', '--sample_s', '0.2'],
        capture_output=True, text=True, timeout=180, cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'},  # one CPU device, not the tests' 8
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith('{"settings"')))
    assert result['median_step_ms'] > 0 and 0 <= result['blocked_ms'] < 1e3
    assert len(result['after_save_vs_median']) == 4  # steps 11-14
    assert 0 < result['commit_s'] < 60
    assert (tmp_path / 'out' / 'ck' / 'checkpoint_step_000010' / 'params').is_dir()
    samples = [line for line in lines if ' ms x' in line]
    assert samples and all('MainThread: ' in line for line in samples)
