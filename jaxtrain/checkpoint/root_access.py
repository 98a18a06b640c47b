"""Before step 1: is --checkpoint_dir a usable root, and does this run own it?

`owned_checkpoint_dir(config)` is the one call the loop makes. In order, each before
anything else touches the root:
  1. a step directory given as the root is refused (its steps would nest inside it);
  2. the root is created if missing;
  3. process 0 takes the lock (root_access.py) and every process learns the outcome, so no
     process opens the root (Orbax removes temporary directories when it does) before the
     lock is held, and none waits forever for a process 0 that was refused;
  4. every process probes the root: create, write, rename and delete a file of its own,
     so a file, a read-only mount or a directory under a file is named now, not at the
     first save after the training that precedes it.
The lock is released when the block ends, and a root this run created is removed again
if it is still empty (a run refused or failed before its first save changes nothing).

One run at a time in a checkpoint root: the lock file `<checkpoint_dir>/jaxtrain.lock`.

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

import contextlib
import errno
import os
import socket
from pathlib import Path
import json
import secrets
import sys
import time

from jaxtrain.checkpoint.layout import (
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    UNFINISHED_SAVE,
    CheckpointError,
    step_of,
)


_USABLE = 'expected a directory this run can create, write, rename and delete files in'


def refuse_step_dir_as_root(checkpoint_dir: str) -> None:
    path = Path(checkpoint_dir)
    real = path.resolve()
    is_step = (
        step_of(real) is not None
        or UNFINISHED_SAVE in real.name
        or (real / TRAINER_STATE_FILE).is_file()
        or (real / 'params').is_dir()
    )
    if is_step:
        raise CheckpointError(
            f'checkpoint_dir: {path}: expected a checkpoint root (the directory that holds '
            f'{STEP_PREFIX}_NNNNNN/ directories), found a step directory. Pass its parent '
            f'--checkpoint_dir {path.parent} (with --resume_from latest), or --resume_from {path}.'
        )


def _unusable(root: Path, doing: str, error: OSError) -> CheckpointError:
    in_the_way = (FileExistsError, NotADirectoryError)
    if isinstance(error, in_the_way) or error.errno in (errno.EEXIST, errno.ENOTDIR):
        blocking = next((p for p in [root, *root.parents] if p.exists() and not p.is_dir()), None)
        found = f'{blocking} is a file' if blocking is not None else (error.strerror or type(error).__name__)
    else:
        found = error.strerror or type(error).__name__
    return CheckpointError(
        f'checkpoint_dir: {root}: {_USABLE}, found {found} (while {doing}). Pass another '
        '--checkpoint_dir, or make this one writable.'
    )


def make_root(checkpoint_dir: str) -> tuple[Path, list[Path]]:
    """(the root, the directories created for it, outermost first)."""
    root = Path(checkpoint_dir).absolute()
    missing = [p for p in [root, *root.parents] if not p.exists()][::-1]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unusable(root, 'creating it', e) from None
    if not root.is_dir():
        raise _unusable(root, 'creating it', NotADirectoryError(errno.ENOTDIR, 'not a directory'))
    return root, missing


def remove_if_empty(created: list[Path]) -> None:
    """Undoes make_root for a run that saved nothing: the directories it created, while
    empty (a refused or failed run leaves the disk as it found it)."""
    for path in reversed(created):
        try:
            path.rmdir()  # only ever succeeds on an empty directory
        except OSError:
            return


def probe_root(root: Path) -> None:
    """Creates, writes, renames and deletes a file of this process's own in root."""
    name = f'.jaxtrain-probe-{socket.gethostname()}-{os.getpid()}'
    first, second = root / name, root / f'{name}-renamed'
    doing = 'creating a test file'
    try:
        with open(first, 'wb') as f:
            doing = 'writing a test file'
            f.write(b'jaxtrain checks that it can save here\n')
            f.flush()
            os.fsync(f.fileno())
        doing = 'renaming a test file'
        os.rename(first, second)
        doing = 'deleting a test file'
        os.unlink(second)
    except OSError as e:
        for leftover in (first, second):
            with contextlib.suppress(OSError):
                leftover.unlink()
        raise _unusable(root, doing, e) from None


def _all_agree(ok: bool) -> bool:
    """Whether `ok` holds on every process (one process: itself)."""
    import jax

    if jax.process_count() == 1:
        return ok
    import numpy as np
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.array([int(ok)], np.int32))
    return bool(np.asarray(votes).all())


@contextlib.contextmanager
def owned_checkpoint_dir(config, info=print):
    """Holds config.checkpoint_dir for the block (nothing to do without one); `info` gets
    the notice of a stale lock taken over."""
    if not config.checkpoint_dir:
        yield None
        return
    import jax

    lock, failure, created = None, None, []
    if jax.process_index() == 0:
        try:
            refuse_step_dir_as_root(config.checkpoint_dir)
            root, created = make_root(config.checkpoint_dir)
            lock = RootLock(root)
            try:
                notice = lock.acquire()
            except OSError as e:  # not EEXIST: the root refuses files
                raise _unusable(root, 'creating the lock file', e) from None
            if notice:
                info(notice)
        except CheckpointError as e:
            failure = e
            remove_if_empty(created)
    # Every process waits for process 0's lock before it goes on to open the root.
    if not _all_agree(failure is None):
        if failure is not None:
            raise failure
        raise CheckpointError(
            f'checkpoint_dir: {config.checkpoint_dir}: process 0 could not take it (its error says why)'
        )
    try:
        try:
            probe_root(Path(config.checkpoint_dir).absolute())
        except CheckpointError as e:
            failure = e
        if not _all_agree(failure is None):
            if failure is not None:
                raise failure
            raise CheckpointError(
                f'checkpoint_dir: {config.checkpoint_dir}: another process could not write there '
                '(its error says why)'
            )
        yield lock
    finally:
        if lock is not None:
            lock.release()
        with contextlib.suppress(OSError):  # a root turned read-only keeps the run's own error
            remove_if_empty(created)


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
