"""Read and write Karpathy llm.c and InfiniTrain binary files, and Hugging Face folders, with NumPy.

Model files (GPT-2 versions 3/5; LLaMA-3 in InfiniTrain's and llm.c's llama3-branch layouts) load to
(header, params): a frozen header dataclass and a nested dict of float32 arrays laid out as
PARAMS_SPEC.md describes. Token shards load as read-only memory maps. Every malformed input raises
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

from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header, load_gpt2, save_gpt2
from llmc_io.header import ModelInfo
from llmc_io.hf import load_hf, save_hf
from llmc_io.llama3 import LAYOUT_INFINITRAIN, LLaMA3Header, load_llama3, save_llama3
from llmc_io.llama3_header import LAYOUT_LLMC
from llmc_io.model import load_model, model_info
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
