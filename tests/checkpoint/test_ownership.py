"""The lock of a checkpoint root (checkpoint/root_access.py): a holder that is running, on
another host, gone, reused or unreadable. Two real trainer processes in one directory:
tests/train/test_concurrent_runs.py."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from jaxtrain.checkpoint import root_access as ownership
from jaxtrain.checkpoint.layout import CheckpointError


def _lock_file(root, **fields):
    record = {'host': socket.gethostname(), 'pid': os.getpid(), 'started_at': time.time(), **fields}
    (root / ownership.LOCK_FILE).write_text(json.dumps(record))
    return record


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, '-c', 'pass'])
    process.wait()
    return process.pid


def test_a_free_root_is_taken_and_released(tmp_path):
    lock = ownership.RootLock(tmp_path)
    assert lock.acquire() == ''
    held = json.loads((tmp_path / ownership.LOCK_FILE).read_text())
    assert (held['host'], held['pid']) == (socket.gethostname(), os.getpid())
    with pytest.raises(CheckpointError):  # the same process cannot take it twice either
        ownership.RootLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / ownership.LOCK_FILE).exists()


def test_a_running_holder_is_named_in_one_line(tmp_path):
    sleeper = subprocess.Popen(['sleep', '30'])
    try:
        _lock_file(tmp_path, pid=sleeper.pid, command='python -m jaxtrain.main --seed 7')
        before = (tmp_path / ownership.LOCK_FILE).read_bytes()
        with pytest.raises(CheckpointError) as refused:
            ownership.RootLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    message = str(refused.value)
    assert '\n' not in message
    for fragment in (f'pid {sleeper.pid}', f'host {socket.gethostname()}', '--seed 7', 'checkpoint_dir'):
        assert fragment in message, message
    assert (tmp_path / ownership.LOCK_FILE).read_bytes() == before


def test_a_holder_on_another_host_is_never_taken_over(tmp_path):
    _lock_file(tmp_path, host='some-other-host', pid=_dead_pid())
    with pytest.raises(CheckpointError, match='host some-other-host'):
        ownership.RootLock(tmp_path).acquire()


def test_an_unreadable_lock_is_refused(tmp_path):
    (tmp_path / ownership.LOCK_FILE).write_text('')  # a lock being created right now looks like this
    with pytest.raises(CheckpointError, match='unreadable or still being written'):
        ownership.RootLock(tmp_path).acquire()


def test_a_stale_lock_is_taken_over_with_a_notice(tmp_path):
    dead = _dead_pid()
    _lock_file(tmp_path, pid=dead)
    lock = ownership.RootLock(tmp_path)
    notice = lock.acquire()
    assert f'pid {dead}' in notice and 'no longer running' in notice, notice
    assert json.loads((tmp_path / ownership.LOCK_FILE).read_text())['token'] == lock.record['token']
    assert sorted(p.name for p in tmp_path.iterdir()) == [ownership.LOCK_FILE]  # nothing left aside
    lock.release()


def test_a_reused_pid_is_stale(tmp_path):
    """The pid runs, but it is not the process that took the lock (its start time differs)."""
    _lock_file(tmp_path, pid=os.getpid(), pid_start='1')
    assert 'another process' in ownership.RootLock(tmp_path).acquire()


def test_release_leaves_a_lock_that_is_not_its_own(tmp_path):
    lock = ownership.RootLock(tmp_path)
    lock.acquire()
    other = _lock_file(tmp_path, token='someone-else')  # e.g. taken over by a person's hand
    lock.release()
    assert json.loads((tmp_path / ownership.LOCK_FILE).read_text()) == other
