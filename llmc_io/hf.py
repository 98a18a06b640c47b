"""Hugging Face model folders (config.json + model.safetensors) <-> the parameter trees of
PARAMS_SPEC.md, for `GPT2LMHeadModel` and `LlamaForCausalLM`, in NumPy.

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

config.json also keeps the llm.c header fields HF has no name for (`llmc_header`), so that
HF -> llm.c reproduces the header; a folder from elsewhere gets the nearest equivalent.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from llmc_io.atomic_file import TEMP_SUFFIX, write_text_atomically
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header
from llmc_io.llama3 import LLaMA3Header
from llmc_io.safetensors import read_safetensors, write_safetensors

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GPT2_EOT, LLAMA3_BOS, LLAMA3_EOT = 50256, 128000, 128001
# Llama-3.1's RoPE scaling: the constants LLaMA3 (jaxtrain.models.llama3) applies when use_scaled_rope.
LLAMA31_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
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


def _token_or_none(token_id: int, vocab_size: int):
    """The family's special id where the vocabulary has it (transformers warns otherwise)."""
    return token_id if token_id < vocab_size else None


def gpt2_to_hf(header: GPT2Header, params: dict) -> tuple[dict, dict]:
    """(HF tensors, config.json) of a GPT-2 tree."""
    tensors = {
        "transformer.wte.weight": params["wte"]["embedding"][: header.vocab_size],
        "transformer.wpe.weight": params["wpe"]["embedding"],
        "transformer.ln_f.weight": params["ln_f"]["scale"],
        "transformer.ln_f.bias": params["ln_f"]["bias"],
    }
    for layer in range(header.num_layers):
        for hf_name, path in _GPT2_LAYER.items():
            node = params["h"]
            for key in path.split("/"):
                node = node[key]
            tensors[f"transformer.h.{layer}.{hf_name}"] = node[layer]
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": header.vocab_size,
        "n_positions": header.max_seq_len,
        "n_ctx": header.max_seq_len,
        "n_embd": header.channels,
        "n_layer": header.num_layers,
        "n_head": header.num_heads,
        "n_inner": None,
        "activation_function": "gelu_new",  # the tanh GELU
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": _token_or_none(GPT2_EOT, header.vocab_size),
        "eos_token_id": _token_or_none(GPT2_EOT, header.vocab_size),
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "llmc_header": {"padded_vocab_size": header.padded_vocab_size},
    }
    return tensors, config


def llama3_to_hf(header: LLaMA3Header, params: dict) -> tuple[dict, dict]:
    """(HF tensors, config.json) of a LLaMA-3 tree."""
    C, H, kv = header.channels, header.head_dim, header.kv_dim
    order = rope_rows_to_hf(H)
    h = params["h"]
    tensors = {
        "model.embed_tokens.weight": params["wte"]["embedding"],
        "model.norm.weight": params["ln_f"]["scale"],
        "lm_head.weight": params["lm_head"]["kernel"].T,
    }
    for i in range(header.num_layers):
        qkv = h["attn"]["c_attn"]["kernel"][i]
        prefix = f"model.layers.{i}."
        tensors.update(
            {
                prefix + "input_layernorm.weight": h["ln_1"]["scale"][i],
                prefix + "self_attn.q_proj.weight": _permute_heads(qkv[:, :C], H, order).T,
                prefix + "self_attn.k_proj.weight": _permute_heads(qkv[:, C : C + kv], H, order).T,
                prefix + "self_attn.v_proj.weight": qkv[:, C + kv :].T,
                prefix + "self_attn.o_proj.weight": h["attn"]["c_proj"]["kernel"][i].T,
                prefix + "post_attention_layernorm.weight": h["ln_2"]["scale"][i],
                prefix + "mlp.gate_proj.weight": h["mlp"]["c_fc2"]["kernel"][i].T,
                prefix + "mlp.up_proj.weight": h["mlp"]["c_fc"]["kernel"][i].T,
                prefix + "mlp.down_proj.weight": h["mlp"]["c_proj"]["kernel"][i].T,
            }
        )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": header.vocab_size,
        "hidden_size": C,
        "intermediate_size": header.ffn_hidden_dim,
        "num_hidden_layers": header.num_layers,
        "num_attention_heads": header.num_heads,
        "num_key_value_heads": header.num_kv_heads,
        "head_dim": H,
        "hidden_act": "silu",
        "max_position_embeddings": header.max_seq_len,
        "rms_norm_eps": header.norm_eps,
        "rope_theta": header.rope_theta,
        "rope_scaling": dict(LLAMA31_ROPE_SCALING) if header.use_scaled_rope else None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": _token_or_none(LLAMA3_BOS, header.vocab_size),
        "eos_token_id": _token_or_none(LLAMA3_EOT, header.vocab_size),
        "torch_dtype": "float32",
        "llmc_header": {
            "ffn_dim_multiplier": header.ffn_dim_multiplier,
            "multiple_of": header.multiple_of,
            "max_gen_batch_size": header.max_gen_batch_size,
        },
    }
    return tensors, config


def save_hf(directory: str | os.PathLike, header, params: dict) -> list[str]:
    """Writes config.json and model.safetensors (fp32) into `directory`; returns the paths.

    A new folder is built under a temporary name and renamed into place once both files are complete;
    into an existing one each file is written under a temporary name and renamed over the old
    (llmc_io/atomic_file.py), so a kill never leaves a truncated file where a good one was.
    """
    directory = Path(directory)
    convert = gpt2_to_hf if isinstance(header, GPT2Header) else llama3_to_hf
    tensors, config = convert(header, params)
    tensors = {name: np.asarray(t, np.float32) for name, t in tensors.items()}
    paths = [os.fspath(directory / CONFIG_FILE), os.fspath(directory / WEIGHTS_FILE)]
    if directory.is_dir():
        write_safetensors(directory / WEIGHTS_FILE, tensors, {"format": "pt"})
        write_text_atomically(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        return paths
    directory.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=directory.name + ".", suffix=TEMP_SUFFIX, dir=directory.parent))
    try:
        write_safetensors(building / WEIGHTS_FILE, tensors, {"format": "pt"})
        write_text_atomically(building / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        os.chmod(building, 0o755)  # mkdtemp makes it private
        os.rename(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return paths


# ---- import -----------------------------------------------------------------------------------


def _take(tensors: dict, name: str, shape, where) -> np.ndarray:
    if name not in tensors:
        raise LLMCFormatError(
            where, name, f"a tensor of shape {tuple(shape)}", "none", "not this model's folder?"
        )
    array = tensors.pop(name)
    if tuple(array.shape) != tuple(shape):
        raise LLMCFormatError(where, f"{name} shape", tuple(shape), tuple(array.shape))
    return np.asarray(array, np.float32)


def _config_float(config: dict, key: str, default: float, where) -> float:
    value = config.get(key, default)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise LLMCFormatError(where, f"config.json {key}", "a positive number", value)
    return float(value)


def _config_int(config: dict, key: str, where) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LLMCFormatError(where, f"config.json {key}", "a positive integer", value)
    return value


def _gpt2_from_hf(config: dict, tensors: dict, where) -> tuple[GPT2Header, dict]:
    V, C = _config_int(config, "vocab_size", where), _config_int(config, "n_embd", where)
    L, T = _config_int(config, "n_layer", where), _config_int(config, "n_positions", where)
    stored = config.get("llmc_header") or {}
    if not isinstance(stored, dict):
        raise LLMCFormatError(where, "config.json llmc_header", "an object (written by llmc_io)", stored)
    padded = stored.get("padded_vocab_size") or 128 * math.ceil(V / 128)
    if isinstance(padded, bool) or not isinstance(padded, int) or padded < V:
        field = "config.json llmc_header.padded_vocab_size"
        raise LLMCFormatError(where, field, f"an integer >= {V}", padded)
    N = _config_int(config, "n_head", where)
    if C % N:
        raise LLMCFormatError(where, "config.json n_head", f"a divisor of n_embd {C}", N)
    header = GPT2Header(T, V, padded, L, N, C)
    # In place: load_hf reports whatever is left over. save_pretrained writes the prefix, old files not.
    stripped = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    tensors.clear()
    tensors.update(stripped)
    for name in [n for n in tensors if n.endswith((".attn.bias", ".attn.masked_bias"))]:
        del tensors[name]  # old files keep the causal-mask buffers; they hold no weights
    wte = np.zeros((padded, C), np.float32)
    wte[:V] = _take(tensors, "wte.weight", (V, C), where)
    if "lm_head.weight" in tensors and not np.array_equal(tensors.pop("lm_head.weight"), wte[:V]):
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
    return header, params


def _ffn_fields(C: int, F: int, stored: dict) -> tuple[float, int]:
    """(ffn_dim_multiplier, multiple_of) that give hidden size F (FORMATS §2c's rounding)."""
    if "ffn_dim_multiplier" in stored and "multiple_of" in stored:
        return float(stored["ffn_dim_multiplier"]), int(stored["multiple_of"])
    # A folder from elsewhere: multiple_of = F rounds any multiplier in (0, F / hidden] up to F.
    return F / int(2 * (4 * C) / 3), F


def _llama3_from_hf(config: dict, tensors: dict, where) -> tuple[LLaMA3Header, dict]:
    get = lambda key: _config_int(config, key, where)  # noqa: E731
    V, C, L, N = get("vocab_size"), get("hidden_size"), get("num_hidden_layers"), get("num_attention_heads")
    K = get("num_key_value_heads") if config.get("num_key_value_heads") is not None else N
    F, T = get("intermediate_size"), get("max_position_embeddings")
    if C % N or N % K:
        raise LLMCFormatError(
            where,
            "config.json num_attention_heads / num_key_value_heads",
            f"heads dividing hidden_size {C} and a multiple of the key/value heads",
            f"{N} / {K}",
        )
    if config.get("head_dim") not in (None, C // N):
        raise LLMCFormatError(
            where, "config.json head_dim", f"{C // N} (hidden_size / heads)", config["head_dim"]
        )
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise LLMCFormatError(where, "config.json rope_scaling", f"null or {LLAMA31_ROPE_SCALING}", scaling)
    if scaling and {k: scaling.get(k) for k in LLAMA31_ROPE_SCALING} != LLAMA31_ROPE_SCALING:
        raise LLMCFormatError(where, "config.json rope_scaling", f"null or {LLAMA31_ROPE_SCALING}", scaling)
    stored = config.get("llmc_header") or {}
    if not isinstance(stored, dict):
        raise LLMCFormatError(where, "config.json llmc_header", "an object (written by llmc_io)", stored)
    try:
        multiplier, multiple_of = _ffn_fields(C, F, stored)
        max_gen_batch_size = int(stored.get("max_gen_batch_size", 4))
    except (TypeError, ValueError):
        expected = "numbers, as llmc_io writes them"
        raise LLMCFormatError(where, "config.json llmc_header", expected, stored) from None
    header = LLaMA3Header(
        T,
        V,
        L,
        N,
        K,
        C,
        multiplier,
        multiple_of,
        _config_float(config, "rms_norm_eps", 1e-5, where),
        _config_float(config, "rope_theta", 10000.0, where),
        bool(scaling),
        max_gen_batch_size,
    )
    if header.ffn_hidden_dim != F:
        raise LLMCFormatError(where, "config.json intermediate_size", header.ffn_hidden_dim, F)
    H, kv = header.head_dim, header.kv_dim
    back = np.argsort(rope_rows_to_hf(H))
    layer = lambda i, name, shape: _take(tensors, f"model.layers.{i}.{name}", shape, where)  # noqa: E731
    qkv, proj, ln_1, ln_2, up, gate, down = ([] for _ in range(7))
    for i in range(L):
        q = _permute_heads(layer(i, "self_attn.q_proj.weight", (C, C)).T, H, back)
        k = _permute_heads(layer(i, "self_attn.k_proj.weight", (kv, C)).T, H, back)
        qkv.append(np.concatenate([q, k, layer(i, "self_attn.v_proj.weight", (kv, C)).T], axis=1))
        proj.append(layer(i, "self_attn.o_proj.weight", (C, C)).T)
        ln_1.append(layer(i, "input_layernorm.weight", (C,)))
        ln_2.append(layer(i, "post_attention_layernorm.weight", (C,)))
        up.append(layer(i, "mlp.up_proj.weight", (F, C)).T)
        gate.append(layer(i, "mlp.gate_proj.weight", (F, C)).T)
        down.append(layer(i, "mlp.down_proj.weight", (C, F)).T)
    wte = _take(tensors, "model.embed_tokens.weight", (V, C), where)
    head = tensors.pop("lm_head.weight", None)
    if head is None and config.get("tie_word_embeddings"):
        head = wte  # a tied folder (Llama 3.2 1B): the file format has an untied head, so copy it
    if head is None or tuple(head.shape) != (V, C):
        raise LLMCFormatError(
            where, "lm_head.weight", f"shape {(V, C)}", None if head is None else head.shape
        )
    stack = lambda arrays: np.ascontiguousarray(np.stack(arrays))  # noqa: E731
    params = {
        "wte": {"embedding": wte},
        "h": {
            "ln_1": {"scale": stack(ln_1)},
            "attn": {"c_attn": {"kernel": stack(qkv)}, "c_proj": {"kernel": stack(proj)}},
            "ln_2": {"scale": stack(ln_2)},
            "mlp": {
                "c_fc": {"kernel": stack(up)},
                "c_fc2": {"kernel": stack(gate)},
                "c_proj": {"kernel": stack(down)},
            },
        },
        "ln_f": {"scale": _take(tensors, "model.norm.weight", (C,), where)},
        "lm_head": {"kernel": np.ascontiguousarray(np.asarray(head, np.float32).T)},
    }
    for name in [n for n in tensors if n.endswith("rotary_emb.inv_freq")]:
        del tensors[name]  # a buffer some older folders hold
    return header, params


def load_hf(directory: str | os.PathLike) -> tuple[GPT2Header | LLaMA3Header, dict]:
    """(header, params) of an HF GPT2LMHeadModel or LlamaForCausalLM folder (one safetensors file)."""
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise LLMCFormatError(directory, CONFIG_FILE, "an HF model folder's config.json", "none") from None
    except ValueError as e:
        raise LLMCFormatError(directory / CONFIG_FILE, "contents", "JSON", f"unreadable ({e})") from None
    if not isinstance(config, dict):
        raise LLMCFormatError(directory / CONFIG_FILE, "top level", "a JSON object", type(config).__name__)
    if not (directory / WEIGHTS_FILE).exists():
        found = sorted(p.name for p in directory.glob("*.safetensors*")) or "none"
        raise LLMCFormatError(directory, WEIGHTS_FILE, "one safetensors file (no shards)", found)
    tensors, _ = read_safetensors(directory / WEIGHTS_FILE)
    kind = config.get("model_type")
    where = os.fspath(directory / WEIGHTS_FILE)
    if kind == "gpt2":
        header, params = _gpt2_from_hf(config, tensors, where)
    elif kind == "llama":
        header, params = _llama3_from_hf(config, tensors, where)
    else:
        raise LLMCFormatError(directory / CONFIG_FILE, "model_type", "gpt2 or llama", kind)
    if tensors:
        raise LLMCFormatError(where, "tensors", "only the model's", f"also {', '.join(sorted(tensors)[:3])}")
    return header, params


def is_hf_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).exists()
