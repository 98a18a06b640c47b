"""The file digest jaxtrain records for InfiniTrain steps, written here from its definition
(llmc_io/piece_digest.py's docstring) with hashlib alone, for tests to hold ours against."""

import hashlib


def piece_digest(data: bytes, piece_bytes: int = 64 << 20) -> str:
    """sha256 over the concatenated sha256s of the data's pieces of piece_bytes, in order."""
    pieces = (data[start : start + piece_bytes] for start in range(0, len(data), piece_bytes))
    return hashlib.sha256(b''.join(hashlib.sha256(piece).digest() for piece in pieces)).hexdigest()
