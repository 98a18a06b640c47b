"""InfiniTrain's LoRA weights file (`--lora_save_path` / `--lora_load_path`), with NumPy alone.

The layout SaveLoRAWeights writes and LoadLoRAWeights reads (InfiniTrain commit b24d92f,
infini_train/src/nn/lora/lora_utils.cc), all little-endian, no padding:

    uint32 magic 0x4C4F5241 ("LORA")   uint32 version 1   uint32 num_tensors
    num_tensors times:
        uint32 name_len, name bytes (e.g. "transformer.h.0.attn.c_attn.lora_A")
        uint32 num_dims, int64 dims[num_dims]
        float32 data[prod(dims)] (row-major)

Two generations share these bytes (the magic and version did not change):
  head    b24d92f: each rank writes its own tensors in its unordered_map's order, under the
          names LoRAStateDict gives the model it is handed (`module.` first when wrapped in DDP).
  master  PR 150 (branch lora_ddp_loss, f408788, lora_utils.cc SaveLoRAWeights): the DDP
          wrapper is unwrapped (no `module.`), the names are std::sort-ed (byte order, so
          `h.10` before `h.2`), TP shards are all-gathered into full tensors with packed QKV
          rows restored to [Q | K | V], and only dp 0, tp 0, pp 0 writes. Its LoadLoRAWeights
          still accepts a name with a leading `module.` (ResolveLoRAStateDictKey).
A reader must accept any order; this writer uses the order it is given (ordered_for_layout).
"""

from __future__ import annotations

import os

import numpy as np

from llmc_io.atomic_file import write_bytes_atomically
from llmc_io.errors import LLMCFormatError

MAGIC = 0x4C4F5241
VERSION = 1
LAYOUTS = ('master', 'head')
DDP_PREFIX = 'module.'  # parallel::kModuleName + '.'


def ordered_for_layout(tensors: list[tuple[str, np.ndarray]], layout: str) -> list[tuple[str, np.ndarray]]:
    """The tensors in the order `layout` writes them: master sorts the names by their bytes
    (SortedLoRAStateDictNames); head keeps the order given (an unordered_map's upstream)."""
    if layout == 'master':
        return sorted(tensors, key=lambda row: row[0].encode())
    if layout == 'head':
        return list(tensors)
    raise ValueError(f'LoRA weights layout: expected one of {", ".join(LAYOUTS)}, found {layout!r}')


def without_ddp_prefix(name: str, known) -> str:
    """ResolveLoRAStateDictKey: a name the model knows stays; else `module.X` becomes X when
    the model knows X (files written from a DDP-wrapped model at b24d92f)."""
    if name in known or not name.startswith(DDP_PREFIX):
        return name
    stripped = name[len(DDP_PREFIX) :]
    return stripped if stripped in known else name


def write_lora_weights(path, tensors: list[tuple[str, np.ndarray]]) -> None:
    """Writes (name, fp32 array) pairs in the given order."""
    parts = [np.array([MAGIC, VERSION, len(tensors)], '<u4').tobytes()]
    for name, array in tensors:
        encoded = name.encode()
        array = np.ascontiguousarray(array, '<f4')
        parts.append(np.array([len(encoded)], '<u4').tobytes() + encoded)
        parts.append(np.array([array.ndim], '<u4').tobytes() + np.array(array.shape, '<i8').tobytes())
        parts.append(array.tobytes())
    write_bytes_atomically(path, b''.join(parts))


def read_lora_weights(path) -> list[tuple[str, np.ndarray]]:
    """The (name, fp32 array) pairs of the file, in file order."""
    path = os.fspath(path)
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        raise LLMCFormatError(path, 'file', 'an InfiniTrain LoRA weights file', 'nothing there') from None
    offset = 0

    def take(count: int, dtype: str, field: str):
        nonlocal offset
        size = np.dtype(dtype).itemsize * count
        if offset + size > len(data):
            raise LLMCFormatError(
                path,
                field,
                f'{size} more bytes at offset {offset}',
                f'the file ends at {len(data)}',
                'the file is truncated',
            )
        values = np.frombuffer(data, dtype, count, offset)
        offset += size
        return values

    magic, version, count = (int(x) for x in take(3, '<u4', 'header'))
    if magic != MAGIC:
        raise LLMCFormatError(
            path, 'magic', f'0x{MAGIC:08X} ("LORA", an InfiniTrain LoRA weights file)', f'0x{magic:08X}'
        )
    if version != VERSION:
        raise LLMCFormatError(path, 'version', VERSION, version)
    tensors = []
    for index in range(count):
        (name_len,) = take(1, '<u4', f'tensor {index} name length')
        name = bytes(take(int(name_len), 'u1', f'tensor {index} name')).decode(errors='replace')
        (ndim,) = take(1, '<u4', f'{name}: num_dims')
        dims = [int(d) for d in take(int(ndim), '<i8', f'{name}: dims')]
        if any(d < 0 for d in dims):
            raise LLMCFormatError(path, f'{name}: dims', 'non-negative sizes', dims)
        values = take(int(np.prod(dims, dtype=np.int64)), '<f4', f'{name}: data')
        tensors.append((name, values.reshape(dims).astype(np.float32)))
    if offset != len(data):
        raise LLMCFormatError(
            path, 'size', f'{offset} bytes for {count} tensors', f'{len(data)} bytes (trailing data)'
        )
    return tensors
