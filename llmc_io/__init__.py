"""Read and write Karpathy llm.c and InfiniTrain binary files, and Hugging Face folders, with NumPy.

Model files (GPT-2 versions 3/5; LLaMA-3 in InfiniTrain's and llm.c's llama3-branch layouts) load to
(header, params): a frozen header dataclass and a nested dict of float32 arrays laid out as
PARAMS_SPEC.md describes; load_model and model_info (below) tell the family by the magic number in
header slot 0. Token shards load as read-only memory maps. Every malformed input raises
LLMCFormatError with one line naming the file, the field, what was expected and what was found.

    header, params = llmc_io.load_model("gpt2_124M.bin")
    tokens = llmc_io.read_shard("tiny_shakespeare_val.bin")

Tokenizer files (llm.c's magic 20240328, versions 1 and 2; InfiniTrain's 20240801) read with
read_tokenizer; Hugging Face folders (config.json + model.safetensors, or shards and their index;
F32, BF16 or F16) load and save with load_hf / save_hf.

Dependencies: NumPy, and for Hugging Face folders only the `safetensors` library (its NumPy API
reads and writes the weight files, after llmc_io has checked each header against its file) and
`ml_dtypes` (NumPy has no bfloat16; JAX depends on it too). Nothing of jaxtrain, JAX or torch.

`python -m llmc_io info FILE` and `python -m llmc_io convert IN OUT` do the same from a shell.
"""

import os

from llmc_io import header as hdr
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header, gpt2_info, load_gpt2, save_gpt2
from llmc_io.header import ModelInfo
from llmc_io.hf import load_hf, save_hf
from llmc_io.llama3 import LAYOUT_INFINITRAIN, LLaMA3Header, llama3_info, load_llama3, save_llama3
from llmc_io.llama3_header import LAYOUT_LLMC
from llmc_io.shards import ShardInfo, read_shard, shard_info, write_shard
from llmc_io.text.tokenizer import Tokenizer, read_tokenizer, write_tokenizer

__all__ = [
    "LAYOUT_INFINITRAIN",
    "LAYOUT_LLMC",
    "GPT2Header",
    "LLMCFormatError",
    "LLaMA3Header",
    "ModelInfo",
    "ShardInfo",
    "Tokenizer",
    "load_gpt2",
    "load_hf",
    "load_llama3",
    "load_model",
    "model_info",
    "read_shard",
    "read_tokenizer",
    "save_gpt2",
    "save_hf",
    "save_llama3",
    "shard_info",
    "write_shard",
    "write_tokenizer",
]


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
