"""What a run does to its checkpoint root besides saving: it never replaces a step it did
not write, it sets aside step directories that are not committed (one meaning of
"committed" for jaxtrain and Orbax), it keeps the step it resumed from however the path
is spelled, and it refuses an unusable root or a step directory before step 1."""

import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from cli_runs import REPO, run_cli, tree_digest
from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.manager import Checkpointer
from trainer_runs import random_shard, tiny_llmc_model


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """The tiny model and shard at test_checkpointing.py's learning rate (same compiled program)."""
    work = tmp_path_factory.mktemp('root_safety')
    shard, model = random_shard(work / 'train.bin'), tiny_llmc_model(work / 'model.bin')
    return ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]


def _train(tiny, *args):
    result = run_cli(*tiny, *args)
    assert result.code == 0, result.err
    return result


@pytest.fixture(scope='module')
def saved_2_and_4(tiny, tmp_path_factory):
    """One 4-step run saving steps 2 and 4, none rotated away; a test works on a copy
    (saved_copy)."""
    root = tmp_path_factory.mktemp('saved') / 'ck'
    _train(
        tiny, '--checkpoint_dir', root, '--save_steps', 2, '--max_checkpoint_keep', 0, '--num_iteration', 4
    )
    assert layout.committed_steps(root) == [2, 4]
    return root


def saved_copy(saved_2_and_4, root, steps=(2, 4)):
    """root: a copy of the saved run's checkpoint_dir holding only `steps` of its two."""
    left_out = {layout.step_dir_name(step) for step in (2, 4) if step not in steps}
    shutil.copytree(saved_2_and_4, root, ignore=lambda _, names: [n for n in names if n in left_out])
    assert layout.committed_steps(root) == list(steps)
    return root


def test_a_step_directory_this_run_did_not_write_is_never_replaced(tmp_path):
    """Another writer's step 2 appears after this run's manager opened the root: Orbax's
    save would replace it (its manager has not seen it); the run refuses instead."""
    root = tmp_path / 'ck'
    saver = Checkpointer(str(root), keep_latest=0, keep_every=0)
    rng = jax.random.key_data(jax.random.key(0))
    saver.save(1, {'w': jnp.arange(4.0)}, None, rng, {'step': 1})
    saver.wait()
    foreign = root / layout.step_dir_name(2)
    shutil.copytree(root / layout.step_dir_name(1), foreign)
    (foreign / 'written_by').write_text('another run')
    before = tree_digest(foreign)
    saver.save(2, {'w': jnp.zeros(4)}, None, rng, {'step': 2})
    with pytest.raises(CheckpointError, match='this run did not write'):
        saver.wait()
    saver.close()
    assert tree_digest(foreign) == before


@pytest.mark.slow
def test_uncommitted_later_step_directories_do_not_block_resume(tiny, saved_2_and_4, tmp_path):
    root = saved_copy(saved_2_and_4, tmp_path / 'ck')  # steps 2 and 4 of a 4-step run
    saving = ['--checkpoint_dir', root, '--save_steps', 2, '--max_checkpoint_keep', 0]  # no rotation
    (root / layout.step_dir_name(6)).mkdir()  # emptied
    partial = root / layout.step_dir_name(8)  # copied without its trainer state
    shutil.copytree(root / layout.step_dir_name(4), partial)
    shutil.rmtree(partial / 'trainer_state')
    result = _train(tiny, *saving, '--num_iteration', 8, '--resume_from', 'latest')
    assert 'restored step 4' in result.out and 'set aside' in result.out, result.out
    assert layout.committed_steps(root) == [2, 4, 6, 8]
    set_aside = sorted(p.name for p in root.iterdir() if layout.SET_ASIDE in p.name)
    assert set_aside == [f'{layout.step_dir_name(s)}{layout.SET_ASIDE}' for s in (6, 8)]
    assert (root / set_aside[1] / 'params').is_dir()  # set aside, not deleted


@pytest.mark.slow
@pytest.mark.parametrize('spelling', ['dotdot', 'symlink'])
def test_the_step_resumed_from_is_kept_however_it_is_spelled(tiny, saved_2_and_4, tmp_path, spelling):
    root = saved_copy(saved_2_and_4, tmp_path / 'ck', steps=(2,))  # as a 2-step run saving step 2 leaves it
    resume_from, checkpoint_dir = root / layout.step_dir_name(2), root
    if spelling == 'dotdot':
        resume_from = root / '..' / 'ck' / layout.step_dir_name(2)
    else:
        checkpoint_dir = tmp_path / 'link'
        checkpoint_dir.symlink_to(root)
    keep_one = ['--save_steps', 1, '--max_checkpoint_keep', 1, '--num_iteration', 4]
    _train(tiny, *keep_one, '--checkpoint_dir', checkpoint_dir, '--resume_from', resume_from)
    assert layout.committed_steps(root) == [2, 4]


def _refused_before_step_1(tiny, *args):
    result = run_cli(*tiny, '--num_iteration', 2, '--save_steps', 1, *args)
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    assert 'step    1/' not in result.out, result.out
    return result.error_lines[0]


def test_a_file_as_checkpoint_dir_is_refused_before_step_1(tiny, tmp_path):
    (tmp_path / 'file').write_text('not a directory')
    for checkpoint_dir in (tmp_path / 'file', tmp_path / 'file' / 'ck'):
        line = _refused_before_step_1(tiny, '--checkpoint_dir', checkpoint_dir)
        assert line.startswith(f'error: checkpoint_dir: {checkpoint_dir}:'), line
        assert f'{tmp_path / "file"} is a file' in line, line
    assert (tmp_path / 'file').read_text() == 'not a directory'


_PROBE_READ_ONLY = """
import sys
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.root_access import make_root, probe_root
try:
    probe_root(make_root(sys.argv[1])[0])
except CheckpointError as e:
    print(e)
"""


def test_a_read_only_checkpoint_dir_is_named(tmp_path):
    """A read-only mount (root ignores permission bits, so a tmpfs mounted read-only in a
    private user and mount namespace)."""
    if not shutil.which('unshare'):
        pytest.skip('no unshare')
    mount = tmp_path / 'ro'
    mount.mkdir()
    script = f'mount -t tmpfs -o size=64k,ro tmpfs {mount} || exit 99\n{sys.executable} -c "$0" {mount}/ck'
    done = subprocess.run(
        ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', script, _PROBE_READ_ONLY],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=60,
        check=False,
    )
    if done.returncode == 99:
        pytest.skip('no private mounts here')
    assert f'checkpoint_dir: {mount}/ck:' in done.stdout and 'Read-only file system' in done.stdout, (
        done.stdout + done.stderr
    )


def test_a_step_directory_as_checkpoint_dir_is_refused(tiny, saved_2_and_4, tmp_path):
    root = saved_copy(saved_2_and_4, tmp_path / 'ck', steps=(2,))
    before = tree_digest(root)
    step_dir = root / layout.step_dir_name(2)
    line = _refused_before_step_1(tiny, '--checkpoint_dir', step_dir, '--resume_from', 'latest')
    assert 'found a step directory' in line and f'--checkpoint_dir {root}' in line, line
    assert tree_digest(root) == before
