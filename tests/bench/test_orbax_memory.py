"""bench/orbax_memory.py end to end on the CPU at the tiny model's size: a save that commits, and a
restore of it that reads the state back (its checksums verified) under the limit given."""

import re
import subprocess
import sys

import pytest
from trainer_runs import REPO

pytestmark = pytest.mark.slow  # two processes that import JAX


def _run(*args):
    run = subprocess.run(
        [sys.executable, REPO / 'bench' / 'orbax_memory.py', *map(str, args), '--model', 'tiny'],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_save_and_its_restore_report_time_and_memory(tmp_path):
    saved = _run('save', tmp_path)
    assert re.search(r'^committed: [\d.]+ s \| GiB now/peak VmRSS [\d.]+/[\d.]+ ', saved, re.M), saved
    step = tmp_path / 'checkpoint_step_000001'
    assert (step / 'params').is_dir() and (step / 'opt_state').is_dir()
    restored = _run('restore', step, '--restore_gb', 0.5)
    line = r'^restored \(0.5 GB at a time\): [\d.]+ s \| GiB now/peak VmRSS'
    assert re.search(line, restored, re.M), restored
