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
    path: str | os.PathLike, pieces: Iterable[Callable[[], object]], makers: int = 4, digest=None
) -> str:
    """Write the pieces' outputs one after the other through atomic_output; returns the sha256 (hex)
    of what was written, taken as it is written rather than by reading the file back. digest: what
    takes it instead (hexdigest() of what went through update()), e.g. a piece_digest.PieceDigest.

    Each piece is a callable giving bytes or a C-contiguous array. A large file streams through four
    stages at once: up to 2 x `makers` pieces are made ahead on `makers` threads (NumPy's copies let go
    of the GIL); the writer writes each piece and hands it to the hashing thread without waiting for
    it (the hash trails the write by at most HASH_BEHIND pieces); and the written pages are sent to
    the disk on another thread every FLUSH_BYTES (_FlushBehind). The rate is that of the slowest
    stage rather than of their sum, and only the pieces in flight are ever in memory."""
    digest = hashlib.sha256() if digest is None else digest
    todo = iter(pieces)
    ahead: collections.deque = collections.deque()
    hashing: collections.deque = collections.deque()
    with (
        atomic_output(path) as f,
        concurrent.futures.ThreadPoolExecutor(makers, thread_name_prefix="piece") as pool,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fdatasync") as flusher,
    ):

        def refill():
            while len(ahead) < 2 * makers:
                piece = next(todo, None)
                if piece is None:
                    return
                ahead.append(pool.submit(piece))

        behind = _FlushBehind(f, flusher)
        try:
            refill()
            while ahead:
                data = as_bytes(ahead.popleft().result())
                refill()
                f.write(data)
                hashing.append(hasher.submit(digest.update, data))  # one thread: in the file's order
                while len(hashing) > HASH_BEHIND:
                    hashing.popleft().result()
                behind.wrote(len(data))
            behind.finish()
            for pending in hashing:
                pending.result()
        finally:  # a failure leaves no piece running on while the temporary is removed
            for pending in ahead:
                pending.cancel()
    return digest.hexdigest()


# Pieces written but not yet hashed, at most: the hash (about 1.1 GB/s a stream on a GPU host's
# cores) and the disk then run side by side, each at its own rate, in no more memory than this
# many pieces.
HASH_BEHIND = 4


# Written bytes between two flushes to the disk. The kernel starts writing dirty pages back on its own
# only past vm.dirty_background_ratio (10% of memory: 12.8 GB on a 128 GB host), so a file smaller than
# that would sit in the page cache until the final fsync and be written only then, after the copying:
# the two one after the other. An fdatasync every FLUSH_BYTES, on its own thread, keeps the disk
# writing while the next pieces are made.
FLUSH_BYTES = 256 << 20


class _FlushBehind:
    """fdatasync of a file on another thread every FLUSH_BYTES written; at most one in flight, so
    the writer never runs more than 2 x FLUSH_BYTES ahead of the disk."""

    def __init__(self, f: IO, pool: concurrent.futures.ThreadPoolExecutor):
        self.f, self.pool, self.unflushed, self.pending = f, pool, 0, None

    def wrote(self, nbytes: int) -> None:
        self.unflushed += nbytes
        if self.unflushed < FLUSH_BYTES:
            return
        self.finish()
        self.f.flush()
        self.pending, self.unflushed = self.pool.submit(os.fdatasync, self.f.fileno()), 0

    def finish(self) -> None:
        if self.pending is not None:
            self.pending.result()  # a failed flush (a full disk) raises here, in the writer
            self.pending = None
