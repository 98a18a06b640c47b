"""The safetensors file format in NumPy alone (the `safetensors` package is not a dependency).

Layout (huggingface/safetensors README): an unsigned little-endian 64-bit N, then N bytes of
UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte
offsets into the data that follows the header, row-major, little-endian, no gaps) plus an
optional "__metadata__" of string pairs; the header may be padded with spaces. Tensors here
are written in name order, the header padded to a multiple of 8 bytes as the reference
writer does.
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from llmc_io.atomic_file import atomic_output
from llmc_io.dtypes import bf16_bits_to_fp32
from llmc_io.errors import LLMCFormatError

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # bit patterns; read as float32
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items() if k != "BF16"}
# A header larger than this is not a header (the reference reader's limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000


def write_safetensors(path: str | os.PathLike, tensors: dict, metadata: dict | None = None) -> None:
    """Writes `tensors` ({name: array}); arrays keep their dtype (no bf16: NumPy has none)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if little.dtype.str not in _NAMES and little.dtype != np.bool_:
            raise LLMCFormatError(path, f"tensor {name} dtype", "a safetensors dtype", array.dtype)
        dtype = "BOOL" if little.dtype == np.bool_ else _NAMES[little.dtype.str]
        data = little.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with atomic_output(path) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """({name: array}, metadata). BF16 comes back as float32; every problem is one line."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise LLMCFormatError(path, "file", "an existing file", "nothing at that path") from None
    if len(raw) < 8:
        raise LLMCFormatError(path, "header length", "8 bytes", f"a {len(raw)}-byte file")
    (size,) = struct.unpack("<Q", raw[:8])
    if size > min(MAX_HEADER_BYTES, len(raw) - 8):
        raise LLMCFormatError(
            path,
            "header length",
            f"at most {min(MAX_HEADER_BYTES, len(raw) - 8):,}",
            f"{size:,}",
            "not safetensors",
        )
    try:
        header = json.loads(raw[8 : 8 + size].decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise LLMCFormatError(path, "header", "UTF-8 JSON", f"unreadable text ({e})") from None
    if not isinstance(header, dict):
        raise LLMCFormatError(path, "header", "a JSON object", type(header).__name__)
    data = memoryview(raw)[8 + size :]
    metadata = header.pop("__metadata__", None) or {}
    tensors, spans = {}, []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = (
                _DTYPES[entry["dtype"]],
                list(entry["shape"]),
                entry["data_offsets"],
            )
            if not all(_is_count(n) for n in (*shape, begin, end)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise LLMCFormatError(
                path,
                f"tensor {name}",
                f"dtype (one of {', '.join(_DTYPES)}), shape and data_offsets of integers >= 0",
                entry,
            ) from None
        expected = dtype.itemsize * math.prod(shape)  # Python ints: no overflow for absurd shapes
        if not (0 <= begin <= end <= len(data)) or end - begin != expected:
            raise LLMCFormatError(
                path,
                f"tensor {name} data_offsets",
                f"{expected:,} bytes within the {len(data):,} after the header",
                f"[{begin}, {end}]",
                "the file is truncated or the header is wrong",
            )
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
        tensors[name] = bf16_bits_to_fp32(array) if entry["dtype"] == "BF16" else array.copy()
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin != covered:
            raise LLMCFormatError(path, f"tensor {name} data_offsets", f"to start at byte {covered}", begin)
        covered = end
    if covered != len(data):
        raise LLMCFormatError(
            path, "file size", f"{8 + size + covered:,} bytes", f"{len(raw):,}", "trailing data"
        )
    return tensors, metadata
