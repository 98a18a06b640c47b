"""The digest jaxtrain records for each file of an InfiniTrain step: sha256 over the concatenated
sha256s (32 bytes each) of the file's 64 MiB pieces, in order (the last piece may be shorter; an
empty file has none, and its digest is the sha256 of nothing).

One sha256 over a whole file is a single stream: about 0.76 GB/s on the GPU machine's cores, which
held the read of a LLaMA-3.2 1B step's 12 GB optimizer file to 15.8 s where the disk gave it in
7.6 s. The pieces hash on several threads at once, so the digest keeps up with the disk, whether
it is taken as a file is written (PieceDigest), as it is read (the same), or from the file alone
(file_piece_digest). A file can be checked by hand:

    split -b 64M FILE piece.
    for p in piece.*; do sha256sum -b $p | head -c 64 | xxd -r -p; done | sha256sum
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os

PIECE_BYTES = 64 << 20
THREADS = 4


def _piece_sha256(piece) -> bytes:
    return hashlib.sha256(piece).digest()  # lets go of the GIL: the pieces hash side by side


def _combined(piece_digests) -> str:
    return hashlib.sha256(b"".join(piece_digests)).hexdigest()


class PieceDigest:
    """update() with a file's bytes in order, hexdigest() once at the end. Whole pieces inside one
    update's buffer are hashed from it without a copy, so the caller must leave a buffer as it was
    given (a new array per tensor, as the readers and writers here make). At most 2 x `threads`
    pieces are in flight: update() waits for the oldest beyond that."""

    def __init__(self, threads: int = THREADS):
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="piece-sha256")
        self._in_flight: collections.deque = collections.deque()
        self._done: list[bytes] = []
        self._partial = bytearray()
        self._most_in_flight = 2 * threads

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        if self._partial:
            take = min(PIECE_BYTES - len(self._partial), len(view))
            self._partial += view[:take]
            view = view[take:]
            if len(self._partial) == PIECE_BYTES:
                self._hash(self._partial)
                self._partial = bytearray()
        while len(view) >= PIECE_BYTES:
            self._hash(view[:PIECE_BYTES])
            view = view[PIECE_BYTES:]
        if len(view):
            self._partial += view

    def _hash(self, piece) -> None:
        self._in_flight.append(self._pool.submit(_piece_sha256, piece))
        while len(self._in_flight) > self._most_in_flight:
            self._done.append(self._in_flight.popleft().result())

    def hexdigest(self) -> str:
        """The file's digest; the object is spent after it."""
        if self._partial:
            self._hash(self._partial)
            self._partial = bytearray()
        try:
            self._done += [pending.result() for pending in self._in_flight]
        finally:
            self._in_flight.clear()
            self._pool.shutdown(wait=True)
        return _combined(self._done)

    def close(self) -> None:
        """Lets the threads go without a digest (a read or write that failed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def bytes_piece_digest(data) -> str:
    digest = PieceDigest()
    digest.update(data)
    return digest.hexdigest()


def file_piece_digest(path: str | os.PathLike, threads: int = 2 * THREADS) -> str:
    """The digest of a file on disk, its pieces read and hashed on `threads` threads at once."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        fd = f.fileno()

        def piece_sha256(start: int) -> bytes:
            wanted = min(PIECE_BYTES, size - start)
            data = os.pread(fd, wanted, start)
            while len(data) < wanted:  # pread may return less than asked
                more = os.pread(fd, wanted - len(data), start + len(data))
                if not more:
                    raise OSError(f"{path}: the file ended at {start + len(data)} bytes, expected {size}")
                data += more
            return _piece_sha256(data)

        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="piece-sha256") as pool:
            return _combined(pool.map(piece_sha256, range(0, size, PIECE_BYTES)))
