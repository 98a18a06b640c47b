"""InfiniTrain's "CKPT" state-dict binary (model.ckpt / optimizer.ckpt at HEAD; model.pth / optimizer.pth /
optimizer.bin in the PR generation), read and written byte for byte.

Layout (InfiniTensor/InfiniTrain b24d92f infini_train/src/checkpoint/checkpoint.cc, SaveStateDict /
LoadStateDict; the same code is in f9cb65b5 infini_train/src/checkpoint.cc), little-endian, packed:

    u32 magic 0x54504B43 ("CKPT") | u32 version 1 | u32 count
    count x { u32 name_len | name | i8 dtype | u32 ndim | ndim x i64 dims | u64 nbytes | nbytes raw data }

Nothing follows the last tensor. The entries come in the writer's std::unordered_map order, which this
module keeps (a dict in file order), so reading a file and writing it back gives the same bytes.
dtype is `enum class DataType : int8_t` (b24d92f infini_train/include/datatype.h). NumPy has no bf16:
bf16 tensors travel as their uint16 bit patterns, with dtype code 9 kept beside them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import struct
import threading
from collections.abc import Mapping

import numpy as np

from llmc_io.atomic_file import as_bytes, write_pieces_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.piece_digest import PieceDigest
from llmc_io.tensors import LeafEntry, contiguous

CKPT_MAGIC = 0x54504B43
CKPT_VERSION = 1

# DataType enum value -> (upstream name, NumPy dtype of one element on disk).
DTYPES: dict[int, tuple[str, np.dtype]] = {
    0: ("kBOOL", np.dtype("?")),
    1: ("kUINT8", np.dtype("u1")),
    2: ("kINT8", np.dtype("i1")),
    3: ("kUINT16", np.dtype("<u2")),
    4: ("kINT16", np.dtype("<i2")),
    5: ("kUINT32", np.dtype("<u4")),
    6: ("kINT32", np.dtype("<i4")),
    7: ("kUINT64", np.dtype("<u8")),
    8: ("kINT64", np.dtype("<i8")),
    9: ("kBFLOAT16", np.dtype("<u2")),  # bit patterns
    10: ("kFLOAT16", np.dtype("<f2")),
    11: ("kFLOAT32", np.dtype("<f4")),
    12: ("kFLOAT64", np.dtype("<f8")),
}
KFLOAT32 = 11
KINT64 = 8
KBFLOAT16 = 9

# The dtype code a plain NumPy array is written with (bf16 needs an explicit CkptTensor(dtype=9)).
_CODE_OF_NUMPY = {dt.newbyteorder("<").str: code for code, (_, dt) in DTYPES.items() if code != KBFLOAT16}


@dataclasses.dataclass(frozen=True)
class CkptTensor:
    """One entry: the enum code, and the values as a NumPy array of the file's shape."""

    dtype: int
    array: np.ndarray
    offset: int = -1  # byte offset of the data in the file it came from; -1 when built in memory

    @property
    def dtype_name(self) -> str:
        return DTYPES[self.dtype][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


def dtype_code(array: np.ndarray) -> int:
    """The DataType code for a NumPy array (float32 -> 11, int64 -> 8, ...)."""
    key = np.dtype(array.dtype).newbyteorder("<").str
    if key not in _CODE_OF_NUMPY:
        raise ValueError(f"no InfiniTrain DataType for NumPy dtype {array.dtype}")
    return _CODE_OF_NUMPY[key]


class _Reader:
    """Bounds-checked sequential reads; every shortfall names the field being read."""

    def __init__(self, path: str, f, size: int, hasher=None):
        self.path, self.f, self.size, self.pos = path, f, size, 0
        self.hasher = hasher  # a PieceDigest every byte read goes through, or None

    def _check_room(self, nbytes: int, field: str) -> None:
        if self.pos + nbytes > self.size:
            raise LLMCFormatError(
                self.path,
                field,
                f"{nbytes} bytes at offset {self.pos}",
                f"end of file after {self.size - self.pos} bytes",
                "the file is truncated; copy it again from the run that wrote it",
            )

    def take(self, nbytes: int, field: str) -> bytes:
        self._check_room(nbytes, field)
        data = self.f.read(nbytes)
        self.pos += nbytes
        if self.hasher is not None:
            self.hasher.update(data)
        return data

    def read_array(self, dtype: np.dtype, dims, nbytes: int, field: str) -> np.ndarray:
        """The next `nbytes` read straight into a new array: no bytes object and no second copy."""
        self._check_room(nbytes, field)  # before allocating: a damaged size must not take the memory
        array = np.empty(dims, dtype)
        if self.f.readinto(as_bytes(array)) != array.nbytes:
            raise LLMCFormatError(self.path, field, f"{array.nbytes} bytes", "a short read")
        self.pos += array.nbytes
        if self.hasher is not None:
            self.hasher.update(as_bytes(array))
        return array

    def unpack(self, fmt: str, field: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), field))


def read_state_dict(
    path: str | os.PathLike, digest_of: dict | None = None, place=None
) -> dict[str, CkptTensor]:
    """{name: CkptTensor} of a CKPT file, in file order. Raises LLMCFormatError on any malformation.
    digest_of: a dict that gets {path: the file's digest (piece_digest.py)}, taken from the same read.
    place: a function of each tensor's array, run on a thread of its own as soon as the array is
    read while the next is; the CkptTensor holds what it returns (a restore puts the array on its
    device there, so that the host never holds the whole file)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise LLMCFormatError(path, "file", "a CKPT state-dict file", "nothing there")
    hasher = PieceDigest() if digest_of is not None else None
    placer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="place") if place else None
    try:
        tensors = _read_state_dict(
            path, hasher, None if placer is None else functools.partial(placer.submit, place)
        )
        if placer is not None:
            tensors = {name: dataclasses.replace(t, array=t.array.result()) for name, t in tensors.items()}
        if hasher is not None:
            digest_of[path] = hasher.hexdigest()
        return tensors
    finally:
        if hasher is not None:
            hasher.close()
        if placer is not None:
            placer.shutdown(wait=True, cancel_futures=True)


def _read_state_dict(path: str, hasher, place) -> dict[str, CkptTensor]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = _Reader(path, f, size, hasher)
        (magic,) = r.unpack("I", "magic")
        if magic != CKPT_MAGIC:
            raise LLMCFormatError(
                path,
                "magic",
                f"0x{CKPT_MAGIC:08X} ('CKPT')",
                f"0x{magic:08X}",
                "not an InfiniTrain state dict",
            )
        (version,) = r.unpack("I", "version")
        if version != CKPT_VERSION:
            raise LLMCFormatError(path, "version", str(CKPT_VERSION), str(version))
        (count,) = r.unpack("I", "count")
        tensors: dict[str, CkptTensor] = {}
        for index in range(count):
            where = f"tensor #{index}"
            (name_len,) = r.unpack("I", f"{where} name length")
            raw_name = r.take(name_len, f"{where} name")
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                raise LLMCFormatError(path, f"{where} name", "UTF-8 text", repr(raw_name[:40])) from None
            where = f"tensor '{name}'"
            if name in tensors:
                raise LLMCFormatError(path, f"{where}", "each name once", "a second entry with this name")
            (code,) = r.unpack("b", f"{where} dtype")
            if code not in DTYPES:
                raise LLMCFormatError(path, f"{where} dtype", f"a DataType code 0..{max(DTYPES)}", str(code))
            (ndim,) = r.unpack("I", f"{where} ndim")
            dims = r.unpack(f"{ndim}q", f"{where} dims") if ndim else ()
            if any(d < 0 for d in dims):
                raise LLMCFormatError(path, f"{where} dims", "non-negative sizes", str(list(dims)))
            (nbytes,) = r.unpack("Q", f"{where} nbytes")
            disk_dtype = DTYPES[code][1]
            expected = int(np.prod(dims, dtype=np.int64)) * disk_dtype.itemsize
            if nbytes != expected:
                raise LLMCFormatError(
                    path,
                    f"{where} nbytes",
                    f"{expected} (= dims {list(dims)} x {disk_dtype.itemsize} bytes of {DTYPES[code][0]})",
                    str(nbytes),
                )
            offset = r.pos
            array = r.read_array(disk_dtype, dims, nbytes, f"{where} data")
            tensors[name] = CkptTensor(code, array if place is None else place(array), offset)
        if r.pos != size:
            raise LLMCFormatError(
                path,
                "end of file",
                f"nothing after the {count} tensors the header counts",
                f"{size - r.pos} more bytes at offset {r.pos}",
            )
    return tensors


def _entry(name: str, value) -> CkptTensor:
    if isinstance(value, CkptTensor):
        return value
    array = np.asarray(value)
    return CkptTensor(dtype_code(array), array)


# A tensor's data is written in row slices of about this many bytes, each made contiguous (and
# converted to the file's dtype) on its own: a transposed view of a 1 GiB weight never needs a
# second 1 GiB copy, and the slices feed the hashing and the write as they come.
SLICE_BYTES = 64 << 20


def _entry_header(name: str, entry: CkptTensor) -> bytes:
    if entry.dtype not in DTYPES:
        raise ValueError(f"tensor '{name}': unknown DataType code {entry.dtype}")
    disk_dtype = DTYPES[entry.dtype][1]
    shape = entry.shape
    nbytes = int(np.prod(shape, dtype=np.int64)) * disk_dtype.itemsize
    encoded = name.encode("utf-8")
    return (
        struct.pack("<I", len(encoded))
        + encoded
        + struct.pack("<bI", entry.dtype, len(shape))
        + struct.pack(f"<{len(shape)}q", *shape)
        + struct.pack("<Q", nbytes)
    )


def _data_slices(entry: CkptTensor):
    """Callables, each giving the next contiguous piece of the entry's data in the file's dtype."""
    disk_dtype = DTYPES[entry.dtype][1]
    array = entry.array
    if isinstance(array, LeafEntry):
        return _fetched_slices(array, disk_dtype)
    if array.ndim == 0 or array.nbytes <= SLICE_BYTES:
        # asarray, not ascontiguousarray: that would make a 0-d array 1-d
        return [lambda: np.asarray(array, dtype=disk_dtype, order="C")]
    rows = max(1, SLICE_BYTES // max(1, array[0].nbytes))
    return [
        lambda start=start: contiguous(array[start : start + rows], disk_dtype)
        for start in range(0, array.shape[0], rows)
    ]


def _fetched_slices(entry: LeafEntry, disk_dtype: np.dtype):
    """_data_slices of an entry not yet on the host: the first slice asked for fetches it (the
    writer makes slices on several threads: the others wait for that fetch), and the last one
    made lets it go, so the host holds the entries being written, not the file."""
    rows = max(1, SLICE_BYTES // max(1, entry.nbytes // max(1, entry.shape[0]))) if entry.ndim else 1
    starts = list(range(0, entry.shape[0], rows)) if entry.ndim else [0]
    lock, held = threading.Lock(), {"left": len(starts)}

    def piece(start: int):
        with lock:
            if "array" not in held:
                held["array"] = entry.fetch()
            array = held["array"]
        try:
            if array.ndim == 0:
                return np.asarray(array, dtype=disk_dtype, order="C")
            return contiguous(array[start : start + rows], disk_dtype)
        finally:
            with lock:
                held["left"] -= 1
                if not held["left"]:
                    held.pop("array", None)

    return [functools.partial(piece, start) for start in starts]


def state_dict_pieces(tensors: Mapping[str, CkptTensor | np.ndarray]):
    """The file SaveStateDict writes for `tensors`, in the mapping's order, as a list of callables
    that each return the next piece (bytes or a contiguous array): the file is never in memory
    whole, and a piece is only made when it is asked for."""
    pieces = [lambda: struct.pack("<III", CKPT_MAGIC, CKPT_VERSION, len(tensors))]
    for name, value in tensors.items():
        entry = _entry(name, value)
        header = _entry_header(name, entry)
        pieces.append(lambda header=header: header)
        pieces.extend(_data_slices(entry))
    return pieces


def state_dict_bytes(tensors: Mapping[str, CkptTensor | np.ndarray]) -> bytes:
    """The exact bytes SaveStateDict writes for `tensors`, in the mapping's order."""
    return b"".join(as_bytes(piece()) for piece in state_dict_pieces(tensors))


def write_state_dict(path: str | os.PathLike, tensors: Mapping[str, CkptTensor | np.ndarray]) -> str:
    """Write a CKPT file atomically (a temporary name in the same directory, flushed to the disk,
    then a rename), streamed piece by piece (atomic_file.write_pieces_atomically); returns the
    file's digest (piece_digest.py), taken as it is written."""
    return write_pieces_atomically(path, state_dict_pieces(tensors), digest=PieceDigest())
