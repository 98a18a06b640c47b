"""A failed save's one line gives the advice that fits its cause (layout.py): free space
for a full disk, a writable directory for permission denied, another file system for a
read-only one; and an open Checkpointer's GIL switch interval is the process's again after
close()."""

import errno
import sys
from types import SimpleNamespace

import pytest

from jaxtrain.checkpoint import manager as ckpt_manager
from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.layout import write_failure


@pytest.mark.parametrize(
    'error, reason, advice',
    [
        (OSError(errno.ENOSPC, 'No space left on device'), 'No space left on device', 'Free space'),
        (OSError(errno.EDQUOT, 'Disk quota exceeded'), 'Disk quota exceeded', 'Free space'),
        (PermissionError(errno.EACCES, 'Permission denied'), 'Permission denied', 'writable by this user'),
        (OSError(errno.EROFS, 'Read-only file system'), 'Read-only file system', 'on a writable file system'),
        # Orbax wraps the OS error in its own exception: only the text tells.
        (
            ValueError('Error writing "ck/params/d/x": [Errno 13] Permission denied'),
            'Permission denied',
            'writable by this user',
        ),
        (
            RuntimeError('tensorstore: No space left on device [source locations...]'),
            'No space left on device',
            'Free space',
        ),
        (RuntimeError('something else broke'), 'something else broke', 'Fix the cause named'),
    ],
)
def test_each_cause_gets_its_own_advice(error, reason, advice):
    found_reason, found_advice = write_failure(error)
    assert found_reason == reason and advice in found_advice
    if 'Free space' not in advice:
        assert 'Free space' not in found_advice


def test_orbax_saves_refused_for_permission_do_not_say_free_space(tmp_path):
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path / 'ck'), keep_latest=0, keep_every=0)
    try:
        error = checkpointer._save_failed(PermissionError(errno.EACCES, 'Permission denied', 'x'), 3)
    finally:
        checkpointer.close()
    text = str(error)
    assert 'could not save checkpoint_step_000003: Permission denied; no step was committed.' in text
    assert 'Make the checkpoint_dir writable by this user' in text and 'Free space' not in text
    assert text.endswith('then resume with --resume_from latest.')


def test_infinitrain_saves_refused_for_permission_do_not_say_free_space(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, 'Permission denied', str(tmp_path / 'ck'))

    monkeypatch.setattr(infinitrain_saver, 'save_step_dir', refuse)
    parts = SimpleNamespace(  # what save reads of train/setup.py's TrainerSetup
        setup=SimpleNamespace(model_config=None),
        geometry=SimpleNamespace(accumulation=1, data_parallel=1, context=1),
    )
    saver = infinitrain_saver.InfiniTrainCheckpointer(
        str(tmp_path / 'ck'), 'infinitrain', parts, family='gpt2', keep_latest=0, keep_every=0
    )
    saver.save(5, {}, None, [0, 1], {'data_position': 5})  # returns: the write is in the background
    with pytest.raises(CheckpointError) as refused:
        saver.close()
    text = str(refused.value)
    assert 'could not save checkpoint_step_000005: Permission denied; no step was committed.' in text
    assert 'writable by this user' in text and 'Free space' not in text


def test_close_gives_the_process_its_switch_interval_back(tmp_path):
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        checkpointer = ckpt_manager.Checkpointer(str(tmp_path / 'ck'), keep_latest=0, keep_every=0)
        assert sys.getswitchinterval() <= 0.001  # while saves may be in flight
        checkpointer.close()
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(before)
