"""One run at a time in a checkpoint root: the lock file `<checkpoint_dir>/jaxtrain.lock`.

Two runs writing one root would replace each other's steps (Orbax's save replaces a step
directory of the same name that its own manager has not seen) and delete each other's
in-flight saves (a manager removes temporary directories when it opens the root). So a
run takes the lock before anything opens the root, and a run that cannot take it is
refused having changed nothing.

The lock is a small JSON file created with O_CREAT | O_EXCL, which is atomic on local
filesystems and on NFS v3+: host, pid, start time (plus the pid's own start time and the
host's boot id, so a reused pid or a reboot is recognised). A lock whose holder is on this
host and no longer running is stale and taken over with a notice; a holder on another
host cannot be checked from here, so its lock is only ever removed by a person.
"""

import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from jaxtrain.checkpoint.layout import CheckpointError

LOCK_FILE = 'jaxtrain.lock'
_HELD = set()  # the locks this process holds, released by release_held() on an abort


def _boot_id() -> str:
    try:
        return Path('/proc/sys/kernel/random/boot_id').read_text().strip()
    except OSError:
        return ''


def _process_start(pid: int) -> str:
    """The pid's start time in clock ticks since boot (Linux), '' where unknown."""
    try:
        stat = Path(f'/proc/{pid}/stat').read_text()
    except OSError:
        return ''
    return stat[stat.rfind(')') + 2 :].split()[19]  # field 22, counted after the command name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _describe(holder: dict) -> str:
    started = holder.get('started_at')
    when = (
        time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))
        if isinstance(started, (int, float))
        else 'an unknown time'
    )
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {when}"


def stale_reason(holder: dict) -> str:
    """Why the holder of a lock is certainly gone ('' when it may be running)."""
    if holder.get('host') != socket.gethostname():
        return ''  # another host: nothing here can tell
    pid = holder.get('pid')
    if not isinstance(pid, int) or pid <= 0:
        return ''
    if holder.get('boot_id') and _boot_id() and holder['boot_id'] != _boot_id():
        return 'this host was restarted since'
    if not _alive(pid):
        return 'that process is no longer running'
    if holder.get('pid_start') and _process_start(pid) not in ('', holder['pid_start']):
        return 'that pid now belongs to another process'
    return ''


class RootLock:
    """The lock of one checkpoint root, for this process."""

    def __init__(self, root):
        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        self.record = {
            'host': socket.gethostname(),
            'pid': os.getpid(),
            'started_at': time.time(),
            'pid_start': _process_start(os.getpid()),
            'boot_id': _boot_id(),
            'command': ' '.join(sys.argv)[:400],
            'token': secrets.token_hex(8),  # tells this run's lock from a later one of the same pid
        }
        self.held = False

    def _create(self) -> bool:
        """Creates the lock file holding this run's record; False if one exists."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, 'w') as f:
            json.dump(self.record, f)
            f.flush()
            os.fsync(f.fileno())
        return True

    def _read(self, path=None) -> dict | None:
        """The record in the lock file; {} for one that is unreadable or still being
        written (the instant between O_EXCL and the write); None if it is gone."""
        try:
            text = Path(path or self.path).read_text()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return holder if isinstance(holder, dict) else {}

    def acquire(self) -> str:
        """Takes the lock; returns a notice ('' or the stale lock taken over). Raises a
        one-line CheckpointError naming the holder when another run has it."""
        for _ in range(3):  # a lock released or taken over meanwhile: look again
            if self._create():
                self._hold()
                return ''
            holder = self._read()
            if holder is None:
                continue
            reason = stale_reason(holder) if holder else ''
            if not reason:
                raise self._refusal(holder)
            if self._take_over(holder):
                self._hold()
                return (
                    f'checkpoint_dir: took over the stale lock {self.path} of {_describe(holder)} ({reason})'
                )
        raise self._refusal(self._read() or {})

    def _take_over(self, stale: dict) -> bool:
        """Moves the stale lock aside and creates ours. The move is checked: if what moved
        is not the lock judged stale (another run took it over in between), it goes back."""
        aside = self.path.with_name(f'{LOCK_FILE}.stale-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        if self._read(aside) != stale:
            try:
                os.link(aside, self.path)  # fails if yet another lock exists; that one stays
            except FileExistsError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return self._create()

    def _hold(self):
        self.held = True
        _HELD.add(self)

    def _refusal(self, holder: dict) -> CheckpointError:
        who = _describe(holder) if holder else 'a run whose lock file is unreadable or still being written'
        command = f" ({holder['command']})" if holder.get('command') else ''
        return CheckpointError(
            f'checkpoint_dir: {self.root}: expected no other run using it, found its lock {self.path} '
            f'held by {who}{command}. Wait for that run to end or pass another --checkpoint_dir; if '
            'no run uses it any more (a run on another host cannot be checked from here), delete '
            f'{self.path}.'
        )

    def release(self):
        """Removes the lock if it is still this run's."""
        if not self.held:
            return
        self.held = False
        _HELD.discard(self)
        try:
            holder = self._read()
            if holder and holder.get('token') == self.record['token']:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            # E.g. the filesystem turned read-only: the lock stays, and is seen as stale once this
            # process is gone; the run's own error, not this one, is what to report.
            pass


def release_held():
    """Releases every lock this process holds (a run aborting on a second signal)."""
    for lock in list(_HELD):
        try:
            lock.release()
        except OSError:
            pass
