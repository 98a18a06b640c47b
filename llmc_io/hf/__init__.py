"""Hugging Face model folders (config.json + model.safetensors, or shards with an index) <-> the
parameter trees of PARAMS_SPEC.md, for `GPT2LMHeadModel` and `LlamaForCausalLM`, in NumPy.

Names and layouts follow transformers' own modules (and llm.c's dev/eval/export_hf.py, llm.c
f1e2ace, for GPT-2):

- GPT-2 uses Conv1D, whose weight is (in, out): our Linear kernels as they are, per layer
  `transformer.h.{i}.*`. The vocabulary is cut to V (HF has no padding rows), and the head is
  tied, so, as `save_pretrained` does, no `lm_head.weight` is written (a folder that has one
  must hold wte there).
- LLaMA uses nn.Linear, whose weight is (out, in): every kernel transposed; c_attn is split
  into q_proj, k_proj, v_proj, c_fc2 is gate_proj and c_fc up_proj. HF rotates the halves of a
  head (rotate_half) where Meta and we rotate interleaved pairs (2i, 2i+1), so, as HF's own
  convert_llama_weights_to_hf.py does, the rows of q_proj and k_proj are permuted within each
  head: the even components first, then the odd ones. Attention is then the same function.
  A tied LLaMA (tie_word_embeddings, Llama-3.2-1B and 3B) has no lm_head in either tree.

config.json: config.py. The weight files (single or sharded; F32, BF16 or F16): weights.py.
Exports are built one tensor at a time from the tree (`(shape, make)` pairs), so that a shard's
worth of converted tensors is all the host holds beside the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from llmc_io.atomic_file import TEMP_SUFFIX, write_text_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header
from llmc_io.hf.config import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    generation_config,
    gpt2_config,
    header_from_config,
    llama3_config,
    read_config,
)
from llmc_io.hf.weights import DEFAULT_MAX_SHARD_SIZE, FolderTensors, parse_size, write_weights
from llmc_io.llama3 import LLaMA3Header

_GPT2_LAYER = {  # HF name in transformer.h.{i} -> our tree path under h/
    "ln_1.weight": "ln_1/scale",
    "ln_1.bias": "ln_1/bias",
    "attn.c_attn.weight": "attn/c_attn/kernel",
    "attn.c_attn.bias": "attn/c_attn/bias",
    "attn.c_proj.weight": "attn/c_proj/kernel",
    "attn.c_proj.bias": "attn/c_proj/bias",
    "ln_2.weight": "ln_2/scale",
    "ln_2.bias": "ln_2/bias",
    "mlp.c_fc.weight": "mlp/c_fc/kernel",
    "mlp.c_fc.bias": "mlp/c_fc/bias",
    "mlp.c_proj.weight": "mlp/c_proj/kernel",
    "mlp.c_proj.bias": "mlp/c_proj/bias",
}


def rope_rows_to_hf(head_dim: int) -> np.ndarray:
    """Per-head output order of HF's q/k rows: our components 0, 2, 4, ... then 1, 3, 5, ..."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def _permute_heads(kernel_CxNH, head_dim: int, order) -> np.ndarray:
    C, NH = kernel_CxNH.shape
    return kernel_CxNH.reshape(C, NH // head_dim, head_dim)[:, :, order].reshape(C, NH)


# ---- export -----------------------------------------------------------------------------------


def _node(tree: dict, path: str):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def gpt2_to_hf(header: GPT2Header, params: dict) -> dict:
    """{HF name: (shape, make)} of a GPT-2 tree."""
    C, V = header.channels, header.vocab_size
    tensors = {
        "transformer.wte.weight": ((V, C), lambda: params["wte"]["embedding"][:V]),
        "transformer.wpe.weight": ((header.max_seq_len, C), lambda: params["wpe"]["embedding"]),
        "transformer.ln_f.weight": ((C,), lambda: params["ln_f"]["scale"]),
        "transformer.ln_f.bias": ((C,), lambda: params["ln_f"]["bias"]),
    }
    shapes = header.param_shapes()
    for layer in range(header.num_layers):
        for hf_name, path in _GPT2_LAYER.items():
            make = lambda path=path, layer=layer: _node(params["h"], path)[layer]  # noqa: E731
            tensors[f"transformer.h.{layer}.{hf_name}"] = (shapes["h/" + path][1:], make)
    return tensors


def llama3_to_hf(header: LLaMA3Header, params: dict) -> dict:
    """{HF name: (shape, make)} of a LLaMA-3 tree; a tied one has no lm_head.weight."""
    C, H, kv, F, V = header.channels, header.head_dim, header.kv_dim, header.ffn_hidden_dim, header.vocab_size
    order = rope_rows_to_hf(H)
    h = params["h"]
    qkv = lambda i: h["attn"]["c_attn"]["kernel"][i]  # noqa: E731
    kernel = lambda path, i: _node(h, path)[i].T  # noqa: E731
    tensors = {"model.embed_tokens.weight": ((V, C), lambda: params["wte"]["embedding"])}
    for i in range(header.num_layers):
        prefix = f"model.layers.{i}."
        tensors.update(
            {
                prefix + "input_layernorm.weight": ((C,), lambda i=i: h["ln_1"]["scale"][i]),
                prefix + "self_attn.q_proj.weight": (
                    (C, C),
                    lambda i=i: _permute_heads(qkv(i)[:, :C], H, order).T,
                ),
                prefix + "self_attn.k_proj.weight": (
                    (kv, C),
                    lambda i=i: _permute_heads(qkv(i)[:, C : C + kv], H, order).T,
                ),
                prefix + "self_attn.v_proj.weight": ((kv, C), lambda i=i: qkv(i)[:, C + kv :].T),
                prefix + "self_attn.o_proj.weight": ((C, C), lambda i=i: kernel("attn/c_proj/kernel", i)),
                prefix + "post_attention_layernorm.weight": ((C,), lambda i=i: h["ln_2"]["scale"][i]),
                prefix + "mlp.gate_proj.weight": ((F, C), lambda i=i: kernel("mlp/c_fc2/kernel", i)),
                prefix + "mlp.up_proj.weight": ((F, C), lambda i=i: kernel("mlp/c_fc/kernel", i)),
                prefix + "mlp.down_proj.weight": ((C, F), lambda i=i: kernel("mlp/c_proj/kernel", i)),
            }
        )
    tensors["model.norm.weight"] = ((C,), lambda: params["ln_f"]["scale"])
    if not header.tie_embeddings:
        tensors["lm_head.weight"] = ((V, C), lambda: params["lm_head"]["kernel"].T)
    return tensors


def _write_folder(directory: Path, header, params: dict, dtype: str, max_shard_size: int) -> list[str]:
    if isinstance(header, GPT2Header):
        tensors, config = gpt2_to_hf(header, params), gpt2_config(header, dtype)
    else:
        tensors, config = llama3_to_hf(header, params), llama3_config(header, dtype)
    written = write_weights(directory, tensors, dtype, max_shard_size)
    for name, contents in ((CONFIG_FILE, config), (GENERATION_CONFIG_FILE, generation_config(header))):
        write_text_atomically(directory / name, json.dumps(contents, indent=2) + "\n")
    return [os.fspath(directory / CONFIG_FILE), os.fspath(directory / GENERATION_CONFIG_FILE), *written]


def save_hf(
    directory: str | os.PathLike,
    header,
    params: dict,
    dtype: str = "float32",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> list[str]:
    """Writes config.json, generation_config.json and the weights as `dtype` (float32, bfloat16
    or float16; one model.safetensors, or shards and an index past `max_shard_size`) into
    `directory`; returns the paths.

    A new folder is built under a temporary name and renamed into place once every file is
    complete; into an existing one each file is written under a temporary name and renamed over
    the old (llmc_io/atomic_file.py), so a kill never leaves a truncated file where a good one was.
    """
    directory, limit = Path(directory), parse_size(max_shard_size)
    if directory.is_dir():
        return _write_folder(directory, header, params, dtype, limit)
    directory.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=directory.name + ".", suffix=TEMP_SUFFIX, dir=directory.parent))
    try:
        written = _write_folder(building, header, params, dtype, limit)
        os.chmod(building, 0o755)  # mkdtemp makes it private
        os.rename(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return [os.fspath(directory / Path(p).name) for p in written]


# ---- import -----------------------------------------------------------------------------------


def _take(tensors: FolderTensors, name: str, shape, where) -> np.ndarray:
    if name not in tensors:
        raise LLMCFormatError(
            where, name, f"a tensor of shape {tuple(shape)}", "none", "not this model's folder?"
        )
    if tuple(tensors.shapes[name]) != tuple(shape):
        raise LLMCFormatError(where, f"{name} shape", tuple(shape), tuple(tensors.shapes[name]))
    return np.asarray(tensors.pop(name), np.float32)


def _gpt2_params(header: GPT2Header, tensors: FolderTensors, where) -> dict:
    V, C, T, L = header.vocab_size, header.channels, header.max_seq_len, header.num_layers
    for name in list(tensors):  # save_pretrained writes the prefix, older files not
        if name.startswith("transformer."):
            tensors.rename(name, name.removeprefix("transformer."))
    for name in [n for n in tensors if n.endswith((".attn.bias", ".attn.masked_bias"))]:
        tensors.pop(name)  # old files keep the causal-mask buffers; they hold no weights
    wte = np.zeros((header.padded_vocab_size, C), np.float32)
    wte[:V] = _take(tensors, "wte.weight", (V, C), where)
    if "lm_head.weight" in tensors and not np.array_equal(
        np.asarray(tensors.pop("lm_head.weight"), np.float32), wte[:V]
    ):
        raise LLMCFormatError(
            where, "lm_head.weight", "equal to wte (llm.c's GPT-2 head is tied)", "another tensor"
        )
    params = {"wte": {"embedding": wte}, "wpe": {"embedding": _take(tensors, "wpe.weight", (T, C), where)}}
    params["ln_f"] = {
        "scale": _take(tensors, "ln_f.weight", (C,), where),
        "bias": _take(tensors, "ln_f.bias", (C,), where),
    }
    shapes = header.param_shapes()
    params["h"] = {}
    for hf_name, path in _GPT2_LAYER.items():
        shape = shapes["h/" + path][1:]
        stacked = np.stack([_take(tensors, f"h.{i}.{hf_name}", shape, where) for i in range(L)])
        *parents, leaf = path.split("/")
        node = params["h"]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = stacked
    return params


def _llama3_params(header: LLaMA3Header, tensors: FolderTensors, where) -> dict:
    C, H, kv, F, V = header.channels, header.head_dim, header.kv_dim, header.ffn_hidden_dim, header.vocab_size
    L = header.num_layers
    back = np.argsort(rope_rows_to_hf(H))
    layer = lambda i, name, shape: _take(tensors, f"model.layers.{i}.{name}", shape, where)  # noqa: E731
    h = {
        "ln_1": {"scale": np.empty((L, C), np.float32)},
        "attn": {
            "c_attn": {"kernel": np.empty((L, C, C + 2 * kv), np.float32)},
            "c_proj": {"kernel": np.empty((L, C, C), np.float32)},
        },
        "ln_2": {"scale": np.empty((L, C), np.float32)},
        "mlp": {
            "c_fc": {"kernel": np.empty((L, C, F), np.float32)},
            "c_fc2": {"kernel": np.empty((L, C, F), np.float32)},
            "c_proj": {"kernel": np.empty((L, F, C), np.float32)},
        },
    }
    for i in range(L):  # into preallocated stacks: one layer's tensors at a time beside the tree
        qkv = h["attn"]["c_attn"]["kernel"][i]
        qkv[:, :C] = _permute_heads(layer(i, "self_attn.q_proj.weight", (C, C)).T, H, back)
        qkv[:, C : C + kv] = _permute_heads(layer(i, "self_attn.k_proj.weight", (kv, C)).T, H, back)
        qkv[:, C + kv :] = layer(i, "self_attn.v_proj.weight", (kv, C)).T
        h["attn"]["c_proj"]["kernel"][i] = layer(i, "self_attn.o_proj.weight", (C, C)).T
        h["ln_1"]["scale"][i] = layer(i, "input_layernorm.weight", (C,))
        h["ln_2"]["scale"][i] = layer(i, "post_attention_layernorm.weight", (C,))
        h["mlp"]["c_fc"]["kernel"][i] = layer(i, "mlp.up_proj.weight", (F, C)).T
        h["mlp"]["c_fc2"]["kernel"][i] = layer(i, "mlp.gate_proj.weight", (F, C)).T
        h["mlp"]["c_proj"]["kernel"][i] = layer(i, "mlp.down_proj.weight", (C, F)).T
    wte = _take(tensors, "model.embed_tokens.weight", (V, C), where)
    params = {
        "wte": {"embedding": wte},
        "h": h,
        "ln_f": {"scale": _take(tensors, "model.norm.weight", (C,), where)},
    }
    if header.tie_embeddings:
        # Some tied folders still hold the head; it must be the embedding for the tie to hold.
        if "lm_head.weight" in tensors and not np.array_equal(
            _take(tensors, "lm_head.weight", (V, C), where), wte
        ):
            raise LLMCFormatError(
                where, "lm_head.weight", "equal to embed_tokens (config.json ties them)", "another tensor"
            )
    else:
        params["lm_head"] = {
            "kernel": np.ascontiguousarray(_take(tensors, "lm_head.weight", (V, C), where).T)
        }
    for name in [n for n in tensors if n.endswith("rotary_emb.inv_freq")]:
        tensors.pop(name)  # a buffer some older folders hold
    return params


def load_hf(directory: str | os.PathLike) -> tuple[GPT2Header | LLaMA3Header, dict]:
    """(header, params) of an HF GPT2LMHeadModel or LlamaForCausalLM folder: the architecture from
    config.json, the tensors from model.safetensors or the shards its index names, as float32."""
    directory = Path(directory)
    header = header_from_config(read_config(directory), directory / CONFIG_FILE)
    tensors = FolderTensors(directory)
    where = tensors.files[0] if len(tensors.files) == 1 else os.fspath(directory)
    if isinstance(header, GPT2Header):
        params = _gpt2_params(header, tensors, where)
    else:
        params = _llama3_params(header, tensors, where)
    if len(tensors):
        raise LLMCFormatError(where, "tensors", "only the model's", f"also {', '.join(sorted(tensors)[:3])}")
    return header, params


def is_hf_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).exists()
