"""Before step 1: is --checkpoint_dir a usable root, and does this run own it?

`owned_checkpoint_dir(config)` is the one call the loop makes. In order, each before
anything else touches the root:
  1. a step directory given as the root is refused (its steps would nest inside it);
  2. the root is created if missing;
  3. process 0 takes the lock (ownership.py) and every process learns the outcome, so no
     process opens the root (Orbax removes temporary directories when it does) before the
     lock is held, and none waits forever for a process 0 that was refused;
  4. every process probes the root: create, write, rename and delete a file of its own,
     so a file, a read-only mount or a directory under a file is named now, not at the
     first save after the training that precedes it.
The lock is released when the block ends, and a root this run created is removed again
if it is still empty (a run refused or failed before its first save changes nothing).
"""

import contextlib
import errno
import os
import socket
from pathlib import Path

from jaxtrain.checkpoint.layout import (
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    UNFINISHED_SAVE,
    CheckpointError,
    step_of,
)
from jaxtrain.checkpoint.ownership import RootLock

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
