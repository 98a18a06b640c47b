"""The weight files of a Hugging Face folder: one `model.safetensors`, or shards named by
`model.safetensors.index.json`, read and written with the `safetensors` library (its NumPy API;
bfloat16 is ml_dtypes', which NumPy lacks).

The library trusts a file's header, so each header is checked here first, before any tensor is
allocated: the JSON, each tensor's dtype (F32, BF16 or F16), shape and byte span against the
file's size, spans that tile the data with no gap or overlap, and the index's names against the
shards'. Every problem is one LLMCFormatError line.

Writing follows transformers' save_pretrained: tensors in order, a new shard when the next tensor
would pass `max_shard_size` (a tensor larger than that gets a shard of its own), shards named
`model-0000i-of-0000N.safetensors` and an index whose metadata carries `total_size` (the bytes of
all tensors). One shard's tensors are converted and serialized at a time, and written through
atomic_file (a temporary name, renamed when complete), so beside the tree the host holds at most
one shard twice (its tensors, then their serialized bytes).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from llmc_io.atomic_file import atomic_output, write_text_atomically
from llmc_io.errors import LLMCFormatError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype("<f2")}
EXPORT_DTYPES = {"float32": DTYPES["F32"], "bfloat16": DTYPES["BF16"], "float16": DTYPES["F16"]}
# A header larger than this is not a header (the reference reader's limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
DEFAULT_MAX_SHARD_SIZE = "50GB"  # transformers 5's save_pretrained (4.x took 5GB)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str | int) -> int:
    """Bytes of a size as save_pretrained takes it: an integer, or digits and a unit (`5GB` = 5e9,
    `500MiB` = 500 * 2**20)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"expected a size such as 5GB, 500MB or 2GiB, found {text!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checked_header(path: Path) -> dict:
    """{name: (dtype, shape)} of one safetensors file whose header fits the file, byte for byte."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            start = f.read(8)
            (size,) = struct.unpack("<Q", start) if len(start) == 8 else (None,)
            if size is None:
                raise LLMCFormatError(path, "header length", "8 bytes", f"a {file_size}-byte file")
            if size > min(MAX_HEADER_BYTES, file_size - 8):
                limit = min(MAX_HEADER_BYTES, file_size - 8)
                raise LLMCFormatError(
                    path, "header length", f"at most {limit:,}", f"{size:,}", "not safetensors"
                )
            text = f.read(size)
    except FileNotFoundError:
        raise LLMCFormatError(path, "file", "an existing file", "nothing at that path") from None
    try:
        header = json.loads(text.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise LLMCFormatError(path, "header", "UTF-8 JSON", f"unreadable text ({e})") from None
    if not isinstance(header, dict):
        raise LLMCFormatError(path, "header", "a JSON object", type(header).__name__)
    header.pop("__metadata__", None)
    data_bytes, tensors, spans = file_size - 8 - size, {}, []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], list(entry["shape"]), entry["data_offsets"]
            if not all(_is_count(n) for n in (*shape, begin, end)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise LLMCFormatError(
                path,
                f"tensor {name}",
                f"dtype (one of {', '.join(DTYPES)}), shape and data_offsets of integers >= 0",
                entry,
            ) from None
        expected = dtype.itemsize * math.prod(shape)  # Python ints: no overflow for absurd shapes
        if not (begin <= end <= data_bytes) or end - begin != expected:
            raise LLMCFormatError(
                path,
                f"tensor {name} data_offsets",
                f"{expected:,} bytes within the {data_bytes:,} after the header",
                f"[{begin}, {end}]",
                "the file is truncated or the header is wrong",
            )
        tensors[name] = (dtype, tuple(shape))
        spans.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise LLMCFormatError(path, f"tensor {name} data_offsets", f"to start at byte {covered}", begin)
        covered = end
    if covered != data_bytes:
        raise LLMCFormatError(
            path, "file size", f"{8 + size + covered:,} bytes", f"{file_size:,}", "trailing data"
        )
    return tensors


def _index(directory: Path) -> dict[str, str]:
    """{tensor name: shard file} of the index, each shard a plain file name in the folder."""
    path = directory / INDEX_FILE
    try:
        index = json.loads(path.read_text())
    except ValueError as e:
        raise LLMCFormatError(path, "contents", "JSON", f"unreadable ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise LLMCFormatError(path, "weight_map", "an object of tensor name -> shard file", weight_map)
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise LLMCFormatError(path, f"weight_map {name}", "a .safetensors file name in the folder", shard)
        if not (directory / shard).is_file():
            raise LLMCFormatError(path, f"weight_map {name}", f"{shard} in {directory}", "no such file")
    return weight_map


class FolderTensors:
    """The tensors of a folder's weight files, headers checked up front, each tensor read when
    taken (pop), in the file's dtype: peak memory is what the caller keeps plus one tensor."""

    def __init__(self, directory: str | os.PathLike):
        directory = Path(directory)
        self.where: dict[str, tuple[Path, str]] = {}  # name -> (file, the name the file holds)
        self.shapes: dict[str, tuple] = {}
        if (directory / SINGLE_FILE).is_file():  # transformers' order: the single file first
            files = {directory / SINGLE_FILE: None}
        elif (directory / INDEX_FILE).is_file():
            weight_map = _index(directory)
            files = {directory / shard: set() for shard in dict.fromkeys(weight_map.values())}
            for name, shard in weight_map.items():
                files[directory / shard].add(name)
        else:
            found = sorted(p.name for p in directory.glob("*.safetensors*")) or "none"
            raise LLMCFormatError(directory, "weights", f"{SINGLE_FILE} or {INDEX_FILE}", found)
        for path, named in files.items():
            header = checked_header(path)
            if named is not None and set(header) != named:
                extra, missing = sorted(set(header) - named), sorted(named - set(header))
                found = f"{path.name} also holds {extra[:3]}" if extra else f"{path.name} lacks {missing[:3]}"
                raise LLMCFormatError(
                    directory / INDEX_FILE, "weight_map", f"the names {path.name} holds", found
                )
            for name, (_, shape) in header.items():
                if name in self.where:
                    raise LLMCFormatError(
                        path, f"tensor {name}", "in one file only", f"also in {self.where[name][0].name}"
                    )
                self.where[name], self.shapes[name] = (path, name), shape
        self.files = sorted({os.fspath(p) for p, _ in self.where.values()})

    def __contains__(self, name) -> bool:
        return name in self.where

    def __iter__(self):
        return iter(list(self.where))

    def __len__(self) -> int:
        return len(self.where)

    def rename(self, name: str, new: str) -> None:
        self.where[new], self.shapes[new] = self.where.pop(name), self.shapes.pop(name)

    def pop(self, name: str, *default):
        if name not in self.where and default:
            return default[0]
        from safetensors import safe_open

        path, stored = self.where.pop(name)
        del self.shapes[name]
        with safe_open(os.fspath(path), framework="numpy") as f:
            return f.get_tensor(stored)


def shard_plan(sizes: dict[str, int], max_shard_size: int) -> list[list[str]]:
    """Names per shard, in order: a new shard when the next tensor would pass max_shard_size."""
    shards, current, used = [], [], 0
    for name, size in sizes.items():
        if current and used + size > max_shard_size:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    return shards + [current] if current else shards


def write_weights(directory: Path, tensors: dict, dtype: str, max_shard_size: int) -> list[str]:
    """Writes {name: (shape, make)} as `dtype` (EXPORT_DTYPES) into `directory`, each file under a
    temporary name renamed into place; a folder's earlier weight files not rewritten are removed
    last (the single file wins over an index, so a stale one must not stay). Returns the paths."""
    from safetensors.numpy import save

    target = EXPORT_DTYPES[dtype]
    sizes = {name: target.itemsize * math.prod(shape) for name, (shape, _) in tensors.items()}
    plan = shard_plan(sizes, max_shard_size)
    names = (
        [SINGLE_FILE]
        if len(plan) == 1
        else [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    )
    written = []
    for file_name, shard in zip(names, plan):
        arrays = {name: np.ascontiguousarray(np.asarray(tensors[name][1]()).astype(target)) for name in shard}
        data = save(arrays, metadata={"format": "pt"})
        del arrays  # the serialized shard is all that stays
        with atomic_output(directory / file_name) as f:
            f.write(data)
        del data
        written.append(os.fspath(directory / file_name))
    if len(plan) > 1:
        index = {
            "metadata": {"total_size": sum(sizes.values())},
            "weight_map": {name: file_name for file_name, shard in zip(names, plan) for name in shard},
        }
        write_text_atomically(directory / INDEX_FILE, json.dumps(index, indent=2) + "\n")
        written.append(os.fspath(directory / INDEX_FILE))
    for stale in [
        directory / SINGLE_FILE,
        directory / INDEX_FILE,
        *directory.glob("model-*-of-*.safetensors"),
    ]:
        if os.fspath(stale) not in written and (
            stale.name in (SINGLE_FILE, INDEX_FILE) or SHARD_NAME.fullmatch(stale.name)
        ):
            stale.unlink(missing_ok=True)
    return written
