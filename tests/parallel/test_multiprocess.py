"""Two real processes on localhost (4 fake CPU devices each, one 8-device mesh across them),
started by README's launcher launch/local_multiprocess.sh, train and checkpoint together
through `jax.distributed`; then one process alone resumes from their checkpoint and continues
the uninterrupted single-process run's losses within 1e-5. (README's own
local_multiprocess.sh line is this launch; tests/readme_commands.py leaves it to this test.)"""

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from jaxtrain.checkpoint import layout as ckpt_layout
from jaxtrain.checkpoint import trainer_state as ckpt_record
from trainer_runs import REPO, metrics_losses, random_shard, tiny_llmc_model, train_named

pytestmark = pytest.mark.slow

COMMON = dict(
    num_iteration=6,
    save_steps=3,
    max_checkpoint_keep=10,
    batch_size=1,
    sequence_length=32,
    total_batch_size=256,
    learning_rate=1e-3,
)
TOLERANCE = 1e-5


def launch_two_processes(flags: list[str], log_dir):
    """`launch/local_multiprocess.sh 2 configs/gpt2.py FLAGS` as README runs it, with this
    interpreter; returns (exit status, process 0's output, process 1's log)."""
    env = dict(os.environ, PYTHON=sys.executable, LOG_DIR=str(log_dir))
    env.pop('XLA_FLAGS', None)  # the launcher gives each process its 4 fake devices
    with tempfile.TemporaryFile('w+') as out:  # a pipe nobody reads could fill up and stall it
        launcher = subprocess.Popen(
            ['launch/local_multiprocess.sh', '2', 'configs/gpt2.py', *flags],
            stdout=out, stderr=subprocess.STDOUT, env=env, text=True, cwd=REPO, start_new_session=True,
        )  # fmt: skip
        try:
            code = launcher.wait(timeout=300)
        finally:
            if launcher.poll() is None:  # the launcher and both trainers: its whole session
                os.killpg(launcher.pid, signal.SIGKILL)
        out.seek(0)
        return code, out.read(), (log_dir / 'process_1.log').read_text()


def test_two_processes_train_and_one_process_resumes(tmp_path):
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'), llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin')
    )
    flags = [f'--{key}={value}' for key, value in {**files, **COMMON}.items()]
    flags += [
        '--mesh_fsdp=4',
        f'--checkpoint_dir={tmp_path / "two" / "ck"}',
        f'--metrics_dir={tmp_path / "two" / "m"}',
    ]
    code, *outputs = launch_two_processes(flags, tmp_path)
    assert code == 0, outputs
    assert 'distributed: process 0 of 2' in outputs[0] and 'mesh data 2 × fsdp 4 × tensor 1' in outputs[0]
    assert 'step    6/6' in outputs[0] and 'train loss' not in outputs[1]  # only process 0 logs
    assert not [text for text in outputs if '[Gloo]' in text], outputs  # XLA's CPU collectives' chatter

    root = tmp_path / 'two' / 'ck'
    assert ckpt_layout.committed_steps(root) == [3, 6]
    topology = ckpt_record.read_trainer_state(root / 'checkpoint_step_000003')['topology']
    assert (topology['process_count'], topology['device_count']) == (2, 8)

    # The in-process runs save nothing (no snapshot program compiled): only their losses count.
    reference, _ = train_named(tmp_path, 'uninterrupted', files, COMMON, num_devices=1, save_steps=0)
    two = metrics_losses(tmp_path / 'two' / 'm')
    resumed, out = train_named(
        tmp_path,
        'resumed',
        files,
        COMMON,
        num_devices=1,
        save_steps=0,
        resume_from=str(root / 'checkpoint_step_000003'),
    )
    assert 'topology changed: saved on 8 cpu device(s) in 2 process(es)' in out
    assert sorted(two) == list(range(1, 7)) and sorted(resumed) == list(range(4, 7))
    for step in range(1, 7):
        assert abs(two[step] - reference[step]) <= TOLERANCE, (step, two[step], reference[step])
    for step in range(4, 7):
        assert abs(resumed[step] - reference[step]) <= TOLERANCE, (step, resumed[step], reference[step])
