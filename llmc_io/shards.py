"""llm.c token shards (docs/formats.md §3): a 1024-byte header [magic, version, ntok], then ntok tokens.

GPT-2 shards are uint16 (magic 20240520, version 1); LLaMA-3 shards are uint32 (magic 20240801,
version 7). As in InfiniTrain, the magic picks the token dtype; as in llm.c, the version must match it
and the file size must be exactly 1024 + ntok * itemsize.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from llmc_io import header as hdr
from llmc_io.atomic_file import atomic_output, write_array
from llmc_io.errors import LLMCFormatError


@dataclasses.dataclass(frozen=True)
class ShardKind:
    name: str  # 'gpt2' | 'llama3'
    magic: int
    version: int
    dtype: np.dtype  # little-endian token dtype on disk


SHARD_KINDS = {
    "gpt2": ShardKind("gpt2", hdr.GPT2_SHARD_MAGIC, 1, np.dtype("<u2")),
    "llama3": ShardKind("llama3", hdr.LLAMA3_SHARD_MAGIC, 7, np.dtype("<u4")),
}
_KIND_BY_MAGIC = {kind.magic: kind for kind in SHARD_KINDS.values()}
# ntok is an int32 header slot, and llm.c's loaders index tokens with int.
MAX_TOKENS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    path: str
    kind: str  # 'gpt2' | 'llama3'
    magic: int
    version: int
    dtype: str  # 'uint16' | 'uint32'
    num_tokens: int
    expected_size: int
    actual_size: int


def shard_info(path: str | os.PathLike) -> ShardInfo:
    """Read and check a shard's header against its size (reads no tokens)."""
    path = os.fspath(path)
    ints = hdr.read_header(path)
    magic, version, ntok = (int(v) for v in ints[:3])
    kind = _KIND_BY_MAGIC.get(magic)
    if kind is None:
        expected = " or ".join(hdr.describe_magic(k.magic) for k in SHARD_KINDS.values())
        hint = (
            "this is a model file, not a token shard"
            if magic in (hdr.GPT2_MODEL_MAGIC, hdr.LLAMA3_MODEL_MAGIC)
            else None
        )
        raise LLMCFormatError(path, "header[0] magic", expected, hdr.describe_magic(magic), hint)
    if version != kind.version:
        hint = None
        if kind.name == "llama3":
            hint = (
                "there is no other LLaMA-3 shard version; magic 20240801 with another version may be "
                "InfiniTrain's LLaMA-3 tokenizer file"
            )
        expected = f"{kind.version} for a {kind.name} shard (magic {kind.magic})"
        raise LLMCFormatError(path, "header[1] version", expected, str(version), hint)
    if ntok <= 0:
        raise LLMCFormatError(
            path,
            "header[2] ntok",
            "at least 1 token",
            str(ntok),
            "the shard is empty; regenerate it or leave it out of the glob",
        )
    expected_size = hdr.HEADER_BYTES + ntok * kind.dtype.itemsize
    actual_size = hdr.file_size(path)
    hdr.check_exact_size(
        path, expected_size, actual_size, f"1024-byte header + {ntok:,} {kind.dtype.name} tokens"
    )
    return ShardInfo(
        path=path,
        kind=kind.name,
        magic=magic,
        version=version,
        dtype=kind.dtype.name,
        num_tokens=ntok,
        expected_size=expected_size,
        actual_size=actual_size,
    )


def read_shard(path: str | os.PathLike) -> np.memmap:
    """The tokens of a shard as a read-only memory map (uint16 or uint32 by magic), header checked."""
    info = shard_info(path)
    return np.memmap(
        info.path,
        dtype=SHARD_KINDS[info.kind].dtype,
        mode="r",
        offset=hdr.HEADER_BYTES,
        shape=(info.num_tokens,),
    )


def write_shard(path: str | os.PathLike, tokens, kind: str = "gpt2") -> None:
    """Write `tokens` as a shard of `kind` ('gpt2': uint16, 'llama3': uint32).

    Tokens must be integers that fit the kind's dtype; nothing is silently wrapped or truncated.
    """
    path = os.fspath(path)
    if kind not in SHARD_KINDS:
        raise ValueError(f"kind: expected one of {sorted(SHARD_KINDS)}, found {kind!r}")
    spec = SHARD_KINDS[kind]
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise LLMCFormatError(path, "tokens", "a 1-D array", f"shape {tokens.shape}")
    if not 0 < tokens.size <= MAX_TOKENS:
        raise LLMCFormatError(
            path,
            "tokens",
            f"between 1 and {MAX_TOKENS:,} tokens",
            f"{tokens.size:,}",
            "split the data into several shards" if tokens.size else None,
        )
    if tokens.dtype.kind not in "iu":
        raise LLMCFormatError(path, "tokens", "an integer array", f"dtype {tokens.dtype}")
    limit = np.iinfo(spec.dtype).max
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high > limit:
        raise LLMCFormatError(
            path,
            "tokens",
            f"values in [0, {limit}] for a {kind} shard",
            f"values in [{low}, {high}]",
            "LLaMA-3 token ids need kind='llama3'" if kind == "gpt2" else None,
        )
    header = hdr.pack_header({0: spec.magic, 1: spec.version, 2: tokens.size})
    with atomic_output(path) as f:
        f.write(header)
        write_array(f, tokens.astype(spec.dtype, copy=False))
