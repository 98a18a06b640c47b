"""The seed's acceptance experiment, verbatim, through the trainer's command line: train 100
steps saving every 20, resume a second run from step 40, and InfiniTrain's loss comparison of
steps 41-100 finds zero difference; then SIGTERM to a real trainer process and an exact resume.
(GPT-2 fp32: README's seed block, run by tests/test_readme.py; kill -9 during saves:
test_faults.py; bf16 and accumulation in both families: test_resume_exact.py.)"""

import signal
import subprocess
import sys
import tempfile
import time

import pytest

from process_env import one_device_env
from jaxtrain.checkpoint import layout as ckpt_layout
from cli_runs import assert_resumed_run_matches, run_cli, seed_experiment_setup
from trainer_runs import random_shard, tiny_llmc_model

pytestmark = pytest.mark.slow


def trainer(config_file, *args, log=None):
    """Starts the trainer; its output goes to `log` or a temporary file (a pipe nobody
    reads would fill up and stall it)."""
    command = [sys.executable, '-m', 'jaxtrain.main', f'--config={config_file}', *map(str, args)]
    env = one_device_env()  # one CPU device, as a user would run it
    out = log or tempfile.TemporaryFile('w+')
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
    process.output = lambda: (out.seek(0), out.read())[1]
    return process


# GPT-2 in fp32 is README's own seed block, which tests/test_readme.py runs as written and holds to
# the same checks; running it here as well would train the same 160 steps twice. The two runs are
# the commands' own (main.entry_point, one device, as a trainer process has) in this process: what
# is checked is the resume, which a process boundary does not change (the signal test below and
# test_faults.py's kill test start real processes).
@pytest.mark.parametrize('family,dtype', [('llama3', 'bfloat16')])
def test_seed_commands_match_from_step_41(tmp_path, family, dtype):
    common, log_name = seed_experiment_setup(tmp_path, family, dtype)
    config_file = f'configs/{family}.py'
    first = run_cli(*common, '--checkpoint_dir', tmp_path / 'ck' / 'noresume', config=config_file)
    (tmp_path / 'base' / log_name).write_text(first.out + first.err)
    assert first.code == 0, first.err
    second = run_cli(
        *common,
        '--checkpoint_dir',
        tmp_path / 'ck' / 'resumefrom40',
        '--resume_from',
        tmp_path / 'ck' / 'noresume' / 'checkpoint_step_000040',
        config=config_file,
    )
    (tmp_path / 'test' / log_name).write_text(second.out + second.err)
    assert second.code == 0, second.err
    assert ckpt_layout.committed_steps(tmp_path / 'ck' / 'noresume') == [20, 40, 60, 80, 100]
    assert ckpt_layout.committed_steps(tmp_path / 'ck' / 'resumefrom40') == [60, 80, 100]
    assert_resumed_run_matches(
        tmp_path / 'base',
        tmp_path / 'test',
        tmp_path / 'ck' / 'noresume' / 'checkpoint_step_000100',
        tmp_path / 'ck' / 'resumefrom40' / 'checkpoint_step_000100',
    )


def _wait_for_step(metrics_path, step, process, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metrics_path.exists() and f'"step": {step},' in metrics_path.read_text():
            return
        assert process.poll() is None, process.output()
        time.sleep(0.05)
    raise AssertionError(f'step {step} not reached')


def _losses(metrics_path):
    import json

    return {
        row['step']: row['loss']
        for row in map(json.loads, metrics_path.read_text().splitlines())
        if 'loss' in row
    }


def test_sigterm_saves_current_step_and_resume_is_exact(tmp_path):
    signum = signal.SIGTERM  # SIGINT takes the same path (train/loop.py)
    train_bin = random_shard(tmp_path / 'train.bin')
    model_bin = tiny_llmc_model(tmp_path / 'model.bin')
    common = ['--input_bin', train_bin, '--llmc_filepath', model_bin, '--learning_rate', 1e-3]
    run = trainer(
        'configs/gpt2.py',
        *common,
        '--num_iteration',
        100000,
        '--checkpoint_dir',
        tmp_path / 'ck',
        '--metrics_dir',
        tmp_path / 'm1',
    )
    _wait_for_step(tmp_path / 'm1' / 'metrics.jsonl', 5, run)
    run.send_signal(signum)
    run.wait(timeout=120)
    out = run.output()
    assert run.returncode == 0, out
    saved = ckpt_layout.committed_steps(tmp_path / 'ck')
    assert (
        len(saved) == 1
        and f'resume with --resume_from {tmp_path / "ck" / ckpt_layout.step_dir_name(saved[0])}' in out
    )
    stopped_at = saved[0]
    assert max(_losses(tmp_path / 'm1' / 'metrics.jsonl')) == stopped_at

    # The resume and the uninterrupted run are not about signals: in this process (one device,
    # as the trainer process had), compiled as that process compiled.
    end = stopped_at + 3
    resumed = run_cli(
        *common,
        '--num_iteration',
        end,
        '--checkpoint_dir',
        tmp_path / 'ck',
        '--resume_from',
        'latest',
        '--metrics_dir',
        tmp_path / 'm2',
    )
    assert resumed.code == 0, resumed.err
    full = run_cli(*common, '--num_iteration', end, '--metrics_dir', tmp_path / 'm3')
    assert full.code == 0, full.err
    resumed_losses, full_losses = (
        _losses(tmp_path / 'm2' / 'metrics.jsonl'),
        _losses(tmp_path / 'm3' / 'metrics.jsonl'),
    )
    assert sorted(resumed_losses) == list(range(stopped_at + 1, end + 1))
    assert all(resumed_losses[s] == full_losses[s] for s in resumed_losses)
    # The signalled process's own steps are the uninterrupted run's too.
    signalled = _losses(tmp_path / 'm1' / 'metrics.jsonl')
    assert all(signalled[s] == full_losses[s] for s in signalled)
