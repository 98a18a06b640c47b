"""Writing a file so that its name only ever holds a complete file: the old one, or the new one.

Every file the project writes (model files, CKPT state dicts, LoRA adapters, Hugging Face folders,
trainer states, plots, JSON reports) goes through `atomic_output`: the bytes go to a temporary name
in the same directory, are flushed to the disk (fsync, so a full disk fails here and a power loss
cannot leave a zero-length file behind a rename), and only then is the temporary renamed over
`path` (os.replace, atomic on one filesystem). A kill, a full disk or any exception before that
leaves `path` as it was and removes the temporary.

A write that runs out of space raises DiskFullError, which names `path` and says "disk full": the
kernel's ENOSPC (or EDQUOT), and numpy's "N requested and M written" of a short `tofile`, whose
errno numpy drops. Arrays are written with `write_array`, which keeps the kernel's errno.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import errno
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO

TEMP_SUFFIX = ".tmp"
_SHORT_WRITE = re.compile(r"^(\d+) requested and (\d+) written$")  # numpy's tofile, errno lost
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A write that ran out of space; `path` (the name being written) is as it was before."""

    def __init__(self, path: str, why: str):
        super().__init__(errno.ENOSPC, "No space left on device", path)
        self.why = why

    def __str__(self) -> str:
        return f"{self.filename}: disk full ({self.why}) while writing it; the file is as it was before"


def _disk_full(path: str, error: OSError) -> DiskFullError | None:
    if isinstance(error, DiskFullError):
        return None
    if error.errno in _FULL_ERRNOS:
        return DiskFullError(path, os.strerror(error.errno))
    short = _SHORT_WRITE.match(str(error))
    if error.errno is None and short:
        return DiskFullError(path, f"short write: {short[2]} of {short[1]} items written")
    return None


def write_array(f: IO, array) -> None:
    """The array's bytes, C order, through the file object: a failed write keeps its errno (numpy's
    tofile reports a short write with none)."""
    import numpy as np

    f.write(as_bytes(np.ascontiguousarray(array)))


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """A file object ('wb' or 'w') on a temporary sibling of `path`, renamed to `path` when the block
    ends without an exception, removed when it raises."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_output: mode: expected 'wb' or 'w', found {mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, mode, encoding=encoding if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes files private; what we write is read like any other file
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        full = _disk_full(path, error) if isinstance(error, OSError) else None
        if full is not None:
            raise full from error
        raise


def fsync_directory(path: str | os.PathLike) -> None:
    """Makes the directory's entries durable: the renames, creations and removals made in it so far
    survive a power loss before any that follow."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomically(path: str | os.PathLike, payload: bytes) -> None:
    with atomic_output(path) as f:
        f.write(payload)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    with atomic_output(path, "w", encoding="utf-8") as f:
        f.write(text)


def as_bytes(piece):
    """A piece (bytes, or a C-contiguous NumPy array of any shape, 0-d too) as a flat byte buffer."""
    if isinstance(piece, (bytes, bytearray, memoryview)):
        return piece
    return piece.reshape(-1).view("u1")


def write_pieces_atomically(
    path: str | os.PathLike, pieces: Iterable[Callable[[], object]], makers: int = 4
) -> str:
    """Write the pieces' outputs one after the other through atomic_output; returns the sha256 (hex)
    of what was written, taken as it is written rather than by reading the file back.

    Each piece is a callable giving bytes or a C-contiguous array. A large file streams through three
    stages at once: up to 2 x `makers` pieces are made ahead on `makers` threads (NumPy's copies let go
    of the GIL), and while one piece is written the same piece is hashed on another thread, so the
    rate is that of the slowest stage rather than of their sum. Only the pieces in flight are ever
    in memory."""
    digest = hashlib.sha256()
    todo = iter(pieces)
    ahead: collections.deque = collections.deque()
    with (
        atomic_output(path) as f,
        concurrent.futures.ThreadPoolExecutor(makers, thread_name_prefix="piece") as pool,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher,
    ):

        def refill():
            while len(ahead) < 2 * makers:
                piece = next(todo, None)
                if piece is None:
                    return
                ahead.append(pool.submit(piece))

        try:
            refill()
            while ahead:
                data = as_bytes(ahead.popleft().result())
                refill()
                hashing = hasher.submit(digest.update, data)
                f.write(data)
                hashing.result()
        finally:  # a failure leaves no piece running on while the temporary is removed
            for pending in ahead:
                pending.cancel()
    return digest.hexdigest()
