"""Model files of either family, dispatched on the magic number in header slot 0."""

from __future__ import annotations

import os

from llmc_io import header as hdr
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header, gpt2_info, load_gpt2
from llmc_io.llama3 import LLaMA3Header, llama3_info, load_llama3


def _family(path: str | os.PathLike, overrides: dict) -> str:
    magic = int(hdr.read_header(path)[0])
    if magic == hdr.GPT2_MODEL_MAGIC:
        given = sorted(name for name, value in overrides.items() if value is not None)
        if given:
            raise LLMCFormatError(
                path,
                "overrides",
                "none for a GPT-2 model file (they fill LLaMA-3 header floats)",
                ", ".join(given),
            )
        return "gpt2"
    if magic == hdr.LLAMA3_MODEL_MAGIC:
        return "llama3"
    expected = f"{hdr.describe_magic(hdr.GPT2_MODEL_MAGIC)} or {hdr.describe_magic(hdr.LLAMA3_MODEL_MAGIC)}"
    hint = (
        "token shards are read with read_shard"
        if magic in (hdr.GPT2_SHARD_MAGIC, hdr.LLAMA3_SHARD_MAGIC)
        else None
    )
    raise LLMCFormatError(path, "header[0] magic", expected, hdr.describe_magic(magic), hint)


def model_info(path: str | os.PathLike, **overrides) -> hdr.ModelInfo:
    """Kind, layout, version, dtype, header and sizes of a model file, tensors unread.

    `overrides` (LLaMA-3 only; None values are ignored) are load_llama3's keyword arguments.
    """
    if _family(path, overrides) == "gpt2":
        return gpt2_info(path)
    return llama3_info(path, **overrides)


def load_model(path: str | os.PathLike, **overrides) -> tuple[GPT2Header | LLaMA3Header, dict]:
    """(header, params) of a GPT-2 or LLaMA-3 file; the header's type says which family it is."""
    if _family(path, overrides) == "gpt2":
        return load_gpt2(path)
    return load_llama3(path, **overrides)
