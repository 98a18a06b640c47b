"""llmc_io/piece_digest.py against its definition (tests/piece_digests.py, hashlib alone): updates
of any sizes and boundaries, buffers of any dtype, a file read on threads, the empty file."""

import numpy as np
import pytest

from llmc_io import piece_digest
from llmc_io.piece_digest import PieceDigest, bytes_piece_digest, file_piece_digest
from piece_digests import piece_digest as reference

PIECE = 16


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(piece_digest, 'PIECE_BYTES', PIECE)


@pytest.mark.parametrize('sizes', [[0], [5], [16], [17], [3, 13, 16, 1, 40, 7], [100], [15, 1, 15, 2, 64]])
def test_updates_of_any_size_give_the_defined_digest(sizes):
    data = bytes(np.random.default_rng(sum(sizes)).integers(0, 256, sum(sizes), dtype=np.uint8))
    digest, at = PieceDigest(threads=3), 0
    for size in sizes:
        digest.update(data[at : at + size])
        at += size
    assert digest.hexdigest() == reference(data, PIECE)


def test_arrays_are_hashed_as_their_bytes():
    arrays = [np.arange(11, dtype=np.float32), np.ones((3, 4), np.float64), np.array(7, np.int64)]
    digest = PieceDigest()
    for array in arrays:
        digest.update(array)
    assert digest.hexdigest() == reference(b''.join(a.tobytes() for a in arrays), PIECE)


def test_a_file_hashed_on_threads_and_bytes_agree(tmp_path):
    data = bytes(np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8))
    path = tmp_path / 'f'
    path.write_bytes(data)
    assert file_piece_digest(path, threads=4) == reference(data, PIECE) == bytes_piece_digest(data)
    (tmp_path / 'empty').write_bytes(b'')
    assert file_piece_digest(tmp_path / 'empty') == reference(b'', PIECE)


def test_the_defined_digest_is_not_the_files_sha256():
    import hashlib

    data = b'x' * 40
    assert reference(data, PIECE) != hashlib.sha256(data).hexdigest()  # a record says which it holds
