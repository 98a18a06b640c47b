"""Two real processes on localhost (4 fake CPU devices each, one 8-device mesh across them)
train and checkpoint together through `jax.distributed`; then one process alone resumes
from their checkpoint and continues the uninterrupted single-process run's losses within
1e-5."""

import os
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


def start_process(process_id: int, port: int, flags: list[str]):
    command = [
        sys.executable,
        '-m',
        'jaxtrain.main',
        '--config=configs/gpt2.py',
        *flags,
        '--coordinator_address',
        f'localhost:{port}',
        '--num_processes',
        '2',
        '--process_id',
        str(process_id),
    ]
    env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=4')
    out = tempfile.TemporaryFile('w+')  # a pipe nobody reads could fill up and stall the run
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, text=True, cwd=REPO)
    process.output = lambda: (out.seek(0), out.read())[1]
    return process


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
    port = free_port()
    processes = [start_process(i, port, flags) for i in (0, 1)]
    try:
        codes = [p.wait(timeout=300) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    outputs = [p.output() for p in processes]
    assert codes == [0, 0], outputs
    assert 'distributed: process 0 of 2' in outputs[0] and 'mesh data 2 × fsdp 4 × tensor 1' in outputs[0]
    assert 'step    6/6' in outputs[0] and 'train loss' not in outputs[1]  # only process 0 logs

    root = tmp_path / 'two' / 'ck'
    assert ckpt_layout.committed_steps(root) == [3, 6]
    topology = ckpt_record.read_trainer_state(root / 'checkpoint_step_000003')['topology']
    assert (topology['process_count'], topology['device_count']) == (2, 8)

    reference, _ = train_named(tmp_path, 'uninterrupted', files, COMMON, num_devices=1)
    two = metrics_losses(tmp_path / 'two' / 'm')
    resumed, out = train_named(
        tmp_path, 'resumed', files, COMMON, num_devices=1, resume_from=str(root / 'checkpoint_step_000003')
    )
    assert 'topology changed: saved on 8 cpu device(s) in 2 process(es)' in out
    assert sorted(two) == list(range(1, 7)) and sorted(resumed) == list(range(4, 7))
    for step in range(1, 7):
        assert abs(two[step] - reference[step]) <= TOLERANCE, (step, two[step], reference[step])
    for step in range(4, 7):
        assert abs(resumed[step] - reference[step]) <= TOLERANCE, (step, resumed[step], reference[step])
