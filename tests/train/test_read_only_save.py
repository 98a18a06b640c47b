"""A checkpoint root that turns read-only mid-run: the run ends with one line naming the save that
was lost, the last committed step and what to do, and the process exits. It used to report the
lock file instead, then hang for Orbax's 20-minute timeout (checkpoint/orbax_host.py says why).

The filesystem turning read-only is simulated in a real trainer process: a wrapper makes mkdir of
one step directory, and the removal of the lock file, fail with EROFS, as such a filesystem does.
"""

import subprocess
import sys
import textwrap

import pytest
from process_env import one_device_env
from cli_runs import REPO
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint import layout

pytestmark = pytest.mark.slow  # a trainer process

READ_ONLY_FROM_STEP_4 = textwrap.dedent(
    """
    import errno, os, runpy, sys
    real_mkdir, real_unlink = os.mkdir, os.unlink

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    def mkdir(path, *args, **kwargs):
        if 'checkpoint_step_000004' in os.fspath(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        if os.fspath(path).endswith('jaxtrain.lock'):
            refuse(path)
        return real_unlink(path, *args, **kwargs)

    os.mkdir, os.unlink, os.remove = mkdir, unlink, unlink
    sys.argv = ['jaxtrain.main', *sys.argv[1:]]
    runpy.run_module('jaxtrain.main', run_name='__main__', alter_sys=True)
    """
)


def test_a_root_turned_read_only_ends_the_run_in_one_line(tmp_path):
    wrapper = tmp_path / 'read_only_from_step_4.py'
    wrapper.write_text(READ_ONLY_FROM_STEP_4)
    root = tmp_path / 'ck'
    command = [
        sys.executable,
        wrapper,
        f'--config={REPO / "configs/gpt2.py"}',
        '--num_devices',
        1,
        '--input_bin',
        random_shard(tmp_path / 'train.bin'),
        '--llmc_filepath',
        tiny_llmc_model(tmp_path / 'm.bin'),
        '--sample_every',
        0,
        '--learning_rate',  # test_checkpointing.py's rate: its compiled train step
        1e-3,
        '--num_iteration',
        8,
        '--save_steps',
        2,
        '--checkpoint_dir',
        root,
    ]
    env = one_device_env(PYTHONPATH=str(REPO))
    # Before, the process outlived this timeout by far (Orbax waits 1200 s).
    command = list(map(str, command))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f'error: checkpoint_dir: {root}: could not save checkpoint_step_000004: ')
    for fragment in (
        'Read-only file system',
        'checkpoint_step_000002 and earlier are intact',
        'a --checkpoint_dir on a writable file system',
        '--resume_from latest',
    ):
        assert fragment in lines[0], lines[0]
    assert layout.committed_steps(root) == [2]
