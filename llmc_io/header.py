"""The 1024-byte int32 header every llm.c file starts with, magic numbers, and file-size checks.

A header is 256 little-endian int32 slots (docs/formats.md conventions); slots a writer does not name are 0.
The magic number in slot 0 says what kind of file it is, so a wrong file can be named in the error
("this is a GPT-2 token shard") rather than merely rejected.
Header float fields are fp32 values; some layouts store their bit patterns in int32 slots (the
conversions at the end).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from llmc_io.errors import LLMCFormatError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
INT32_LE = np.dtype("<i4")

GPT2_MODEL_MAGIC = 20240326
LLAMA3_MODEL_MAGIC = 20240803
GPT2_SHARD_MAGIC = 20240520
LLAMA3_SHARD_MAGIC = 20240801

# Every llm.c / InfiniTrain magic, so that a file of the wrong kind is named in the error message.
KNOWN_MAGICS = {
    GPT2_MODEL_MAGIC: "GPT-2 model file",
    20240327: "GPT-2 debug state (test_gpt2.c)",
    20240328: "tokenizer file",
    GPT2_SHARD_MAGIC: "GPT-2 token shard",
    # InfiniTrain also uses this magic for its LLaMA-3 tokenizer file.
    LLAMA3_SHARD_MAGIC: "LLaMA-3 token shard",
    LLAMA3_MODEL_MAGIC: "LLaMA-3 model file",
    20240527: "llm.c training state",
}


def describe_magic(magic: int) -> str:
    """`magic` followed by what it identifies, e.g. '20240520 (GPT-2 token shard)'."""
    return f"{magic} ({KNOWN_MAGICS.get(int(magic), 'not an llm.c magic')})"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model file's header says, once checked against the file's size.

    `num_stored_values` counts every value in the file, including the zero biases of the llm.c
    `llama3`-branch layout; `header.num_parameters` counts the tensors llmc_io returns.
    """

    path: str
    kind: str  # 'gpt2' | 'llama3'
    layout: str  # see gpt2.LAYOUT / llama3.LAYOUT_*
    version: int  # header slot 1: 3 = fp32, 5 = bf16
    dtype: str  # 'float32' | 'bfloat16'
    header: object  # GPT2Header | LLaMA3Header
    data_offset: int  # byte where the first tensor starts
    num_stored_values: int
    expected_size: int
    actual_size: int
    major_minor: tuple[int, int] | None = None  # LLaMA version slots (LLaMA-3 files only)
    notes: tuple[str, ...] = ()  # anything a person should know, e.g. overrides used


def file_size(path: str | os.PathLike) -> int:
    """Size in bytes; a missing file is an LLMCFormatError like any other unreadable input."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        raise LLMCFormatError(path, "file", "an existing file", "nothing at that path") from None


def read_int32s(path: str | os.PathLike, count: int = HEADER_INTS, offset: int = 0) -> np.ndarray:
    """`count` little-endian int32 values at byte `offset`, as a native int64 array."""
    size = file_size(path)
    if offset == 0:
        refuse_gzipped(path)
    need = offset + 4 * count
    if size < need:
        raise LLMCFormatError(
            path,
            "file size",
            f"at least {need:,} bytes (the header)",
            f"{size:,}",
            "the file is truncated or not an llm.c file",
        )
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(4 * count)
    # int64 so that arithmetic on header values (sizes of multi-GB files) cannot overflow.
    return np.frombuffer(raw, dtype=INT32_LE).astype(np.int64)


GZIP_MAGIC = b"\x1f\x8b"


def refuse_gzipped(path: str | os.PathLike) -> None:
    """A gzipped llm.c file (as samples are shipped) is named as such, with the command that unpacks
    it, rather than reported as an unknown magic (gzip's bytes read as an int32)."""
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            return
    folder = os.path.dirname(os.path.abspath(path))
    unpack = (
        f"unpack it first: gunzip -k {path}"
        if os.access(folder, os.W_OK) and os.stat(folder).st_mode & 0o222
        else f"its folder is read-only: unpack a copy elsewhere: gunzip -c {path} > FILE"
    )
    raise LLMCFormatError(path, "header[0] magic", "an llm.c file", "a gzipped file (magic 1f 8b)", unpack)


def read_header(path: str | os.PathLike) -> np.ndarray:
    """The 256 header slots of an llm.c file."""
    return read_int32s(path, HEADER_INTS, 0)


def check_magic(path: str | os.PathLike, header: np.ndarray, expected: int, hint: str = "") -> None:
    if int(header[0]) != expected:
        raise LLMCFormatError(
            path, "header[0] magic", describe_magic(expected), describe_magic(int(header[0])), hint or None
        )


def check_exact_size(path: str | os.PathLike, expected: int, actual: int, what: str) -> None:
    """llm.c's C loaders demand the exact size; so do we, naming which way it is off."""
    if actual == expected:
        return
    if actual < expected:
        hint = f"the file is {expected - actual:,} bytes short: truncated, or the header is wrong"
    else:
        hint = f"{actual - expected:,} bytes more than the header accounts for: the header is wrong"
    raise LLMCFormatError(path, "file size", f"{expected:,} bytes ({what})", f"{actual:,}", hint)


def pack_header(slots: dict[int, int], num_ints: int = HEADER_INTS) -> bytes:
    """A little-endian int32 header with the given slots set and every other slot 0."""
    header = np.zeros(num_ints, dtype=INT32_LE)
    for index, value in slots.items():
        if not -(2**31) <= int(value) < 2**31:
            raise ValueError(f"header[{index}]: expected a value that fits int32, found {value}")
        header[index] = int(value)
    return header.tobytes()


# --- fp32 values in int32 slots ---------------------------------------------------------------------


def float_to_int32_bits(value: float) -> int:
    """The fp32 bit pattern of `value`, as the signed int32 stored in a header slot."""
    return int(np.array(value, dtype=np.float32).view(np.int32))


def int32_bits_to_float(bits: int) -> float:
    """The fp32 value whose bit pattern is the int32 header slot `bits`."""
    return float(np.array(bits, dtype=np.int32).view(np.float32))


def round_to_fp32(value: float) -> float:
    """`value` rounded to the nearest fp32, the precision a header float slot holds."""
    return float(np.float32(value))


def fp32_repr(value: float) -> str:
    """The shortest decimal that reads back as the same fp32: '1.4', not '1.399999976158142'."""
    return str(np.float32(value))


def is_fp32_subnormal_or_zero(bits: int) -> bool:
    """True when an int32 slot, read as fp32, has a zero exponent: +-0 or a subnormal.

    A small non-negative integer (e.g. 1, 0, 500000, anything below 2**23) looks like this, which is
    how an integer-truncated float slot is told apart from a real fp32 bit pattern.
    """
    return (int(bits) & 0x7F800000) == 0
