"""Read and write Karpathy llm.c and InfiniTrain binary files with NumPy alone.

Model files (GPT-2 versions 3/5; LLaMA-3 in InfiniTrain's and llm.c's llama3-branch layouts) load to
(header, params): a frozen header dataclass and a nested dict of float32 arrays laid out as
PARAMS_SPEC.md describes. Token shards load as read-only memory maps. Every malformed input raises
LLMCFormatError with one line naming the file, the field, what was expected and what was found.

    header, params = llmc_io.load_model("gpt2_124M.bin")
    tokens = llmc_io.read_shard("tiny_shakespeare_val.bin")

`python -m llmc_io info FILE` and `python -m llmc_io convert IN OUT` do the same from a shell.
"""

from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header, load_gpt2, save_gpt2
from llmc_io.header import ModelInfo
from llmc_io.llama3 import LAYOUT_INFINITRAIN, LLaMA3Header, load_llama3, save_llama3
from llmc_io.llama3_header import LAYOUT_LLMC
from llmc_io.model import load_model, model_info
from llmc_io.shards import ShardInfo, read_shard, shard_info, write_shard

__all__ = [
    "LAYOUT_INFINITRAIN",
    "LAYOUT_LLMC",
    "GPT2Header",
    "LLMCFormatError",
    "LLaMA3Header",
    "ModelInfo",
    "ShardInfo",
    "load_gpt2",
    "load_llama3",
    "load_model",
    "model_info",
    "read_shard",
    "save_gpt2",
    "save_llama3",
    "shard_info",
    "write_shard",
]
