"""bench/recompute_memory.py's command line: an unknown plan is one line before anything is built."""

import subprocess
import sys

from trainer_runs import REPO


def test_an_unknown_plan_is_one_line():
    run = subprocess.run(
        [sys.executable, REPO / 'bench' / 'recompute_memory.py', '--plans', 'off,fullish'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and run.stdout == ''
    last = run.stderr.strip().splitlines()[-1]
    expected = 'expected names of off, full, full-uniform-4, full-block-6, selective, found fullish'
    assert last.endswith(f'error: --plans: {expected}')
    assert 'Traceback' not in run.stderr
