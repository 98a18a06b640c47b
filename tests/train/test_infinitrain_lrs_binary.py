"""The real InfiniTrain binary of PR 151 (a7949ac0) resumes a checkpoint jaxtrain wrote: it loads our
lr_scheduler.ckpt without a WARNING and prints the losses and lr of its own resumed run (b.log).

Skipped unless INFINITRAIN_LRS_BIN names that build's `gpt2` example binary (its `llama3` sits beside it;
../shared/infinitrain/README.md says how to build it, about 7 minutes on two cores). docs/infinitrain.md
gives the command:

    INFINITRAIN_LRS_BIN=/path/to/lrs/build/gpt2 python -m pytest -q tests/train/test_infinitrain_lrs_binary.py
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
from cli_runs import run_cli
from infinitrain_samples import SAMPLES, copy_run_inputs, sample_commands

BINARY = os.environ.get('INFINITRAIN_LRS_BIN', '')
STEP = re.compile(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)\s+\|\s+lr\s+(\S+)\s')
pytestmark = pytest.mark.skipif(not BINARY, reason='INFINITRAIN_LRS_BIN (the PR 151 gpt2 binary) is not set')


def _steps(text: str) -> dict[int, tuple[float, str]]:
    return {int(m[1]): (float(m[2]), m[3]) for m in map(STEP.search, text.splitlines()) if m}


@pytest.mark.slow
@pytest.mark.parametrize('folder, family', [('lrs-gpt2', 'gpt2'), ('lrs-llama3', 'llama3')])
def test_the_lr_scheduler_binary_resumes_our_checkpoint(tmp_path, monkeypatch, folder, family):
    binary = Path(BINARY).with_name(family)
    if not binary.is_file():
        pytest.skip(f'{binary} is not built')
    source = SAMPLES / folder
    monkeypatch.chdir(tmp_path)
    copy_run_inputs(source, tmp_path)
    commands = sample_commands(folder)
    # Ours: run (a) in InfiniTrain's files, stopped after its step-10 save; the decay still spans the
    # 20 steps of upstream's (b), whose --lr_decay_iters 0 takes its --num_iteration 20.
    ours = [w if w != '20' else '10' for w in commands['a.log']] + ['--lr_decay_iters', '20']
    result = run_cli(*ours, '--checkpoint_format', 'infinitrain', config=f'configs/{family}.py:infinitrain')
    assert result.code == 0, result.err
    step_dir = tmp_path / 'a' / 'checkpoint_step_000010'
    assert (step_dir / 'lr_scheduler.ckpt').is_file()
    # Theirs: run (b) exactly as commands.txt gives it, from our step 10.
    run = subprocess.run(
        [str(binary), *commands['b.log']],
        env=dict(os.environ, GLOG_logtostderr='1'),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-2000:]
    assert 'Loading LR scheduler: "a/checkpoint_step_000010/lr_scheduler.ckpt"' in log
    warnings = [
        line for line in log.splitlines() if line.startswith(('W', 'F')) and re.match(r'^[WF]\d{8}', line)
    ]
    assert not warnings, warnings
    resumed, expected = _steps(log), _steps((source / 'b.log').read_text())
    assert sorted(resumed) == sorted(expected) == list(range(11, 21))
    assert [resumed[s][1] for s in resumed] == [expected[s][1] for s in resumed]  # the lr column
    worst = max(abs(resumed[s][0] - expected[s][0]) for s in expected)
    assert worst <= 1e-5, {s: (resumed[s][0], expected[s][0]) for s in expected}
