"""config.json of a Hugging Face GPT2LMHeadModel / LlamaForCausalLM folder <-> the llmc_io header
dataclasses, and generation_config.json.

Reading takes the whole architecture from config.json (hidden size, intermediate size, layers,
heads and key/value heads, head_dim, rms_norm_eps, rope_theta, rope_scaling `llama3` or none,
vocabulary, tie_word_embeddings, max_position_embeddings) and refuses, by name, what the models
cannot represent: biases in LLaMA, other RoPE types, sliding windows, other activations. Both
spellings of RoPE are read: `rope_theta` + `rope_scaling`, and transformers 5's `rope_parameters`.

config.json also keeps the llm.c header fields HF has no name for (`llmc_header`), so that
HF -> llm.c reproduces the header; a folder from elsewhere gets the nearest equivalent.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from llmc_io.header import fp32_repr
from llmc_io.errors import LLMCFormatError
from llmc_io.gpt2 import GPT2Header
from llmc_io.llama3 import LLaMA3Header

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
GPT2_EOT, LLAMA3_BOS, LLAMA3_EOT = 50256, 128000, 128001
_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def read_config(directory: str | os.PathLike) -> dict:
    path = Path(directory) / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise LLMCFormatError(directory, CONFIG_FILE, "an HF model folder's config.json", "none") from None
    except ValueError as e:
        raise LLMCFormatError(path, "contents", "JSON", f"unreadable ({e})") from None
    if not isinstance(config, dict):
        raise LLMCFormatError(path, "top level", "a JSON object", type(config).__name__)
    return config


def _float(config: dict, key: str, default: float, where) -> float:
    value = config.get(key, default)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise LLMCFormatError(where, f"config.json {key}", "a positive number", value)
    return float(value)


def _int(config: dict, key: str, where) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LLMCFormatError(where, f"config.json {key}", "a positive integer", value)
    return value


def _refuse(config: dict, key: str, allowed: tuple, where, why: str) -> None:
    if key in config and config[key] not in allowed:
        expected = " or ".join(json.dumps(a) for a in allowed) + f" ({why})"
        raise LLMCFormatError(where, f"config.json {key}", expected, json.dumps(config[key]))


def _stored(config: dict, where) -> dict:
    stored = config.get("llmc_header") or {}
    if not isinstance(stored, dict):
        raise LLMCFormatError(where, "config.json llmc_header", "an object (written by llmc_io)", stored)
    return stored


def gpt2_header(config: dict, where) -> GPT2Header:
    V, C = _int(config, "vocab_size", where), _int(config, "n_embd", where)
    L, T = _int(config, "n_layer", where), _int(config, "n_positions", where)
    padded = _stored(config, where).get("padded_vocab_size") or 128 * math.ceil(V / 128)
    if isinstance(padded, bool) or not isinstance(padded, int) or padded < V:
        field = "config.json llmc_header.padded_vocab_size"
        raise LLMCFormatError(where, field, f"an integer >= {V}", padded)
    N = _int(config, "n_head", where)
    if C % N:
        raise LLMCFormatError(where, "config.json n_head", f"a divisor of n_embd {C}", N)
    _refuse(config, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), where, "the tanh GELU")
    _refuse(config, "n_inner", (None, 4 * C), where, "an MLP of 4 x n_embd")
    _refuse(config, "layer_norm_epsilon", (1e-5,), where, "GPT-2's LayerNorm")
    _refuse(config, "scale_attn_by_inverse_layer_idx", (False,), where, "GPT-2's attention")
    _refuse(config, "tie_word_embeddings", (True,), where, "GPT-2's head is wte")
    return GPT2Header(T, V, padded, L, N, C)


def _rope(config: dict, where) -> tuple[float, dict | None]:
    """(rope_theta, the llama3 scaling's fields or None) from either spelling."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):  # transformers 5: theta and scaling in one object
        theta = _float({**config, **parameters}, "rope_theta", 10000.0, where)
        scaling = None if parameters.get("rope_type", "default") == "default" else parameters
        key = "rope_parameters"
    else:
        theta, scaling, key = (
            _float(config, "rope_theta", 10000.0, where),
            config.get("rope_scaling"),
            "rope_scaling",
        )
    if scaling is None:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if kind != "llama3":
        found = kind if kind is not None else scaling
        raise LLMCFormatError(where, f"config.json {key}", "null or rope_type llama3 (Llama-3.1's)", found)
    values = {k: scaling.get(k) for k in _ROPE_KEYS}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values.values()):
        raise LLMCFormatError(where, f"config.json {key}", f"positive {', '.join(_ROPE_KEYS)}", scaling)
    return theta, values


def llama3_header(config: dict, where) -> LLaMA3Header:
    get = lambda key: _int(config, key, where)  # noqa: E731
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
    _refuse(config, "head_dim", (None, C // N), where, "hidden_size / heads")
    _refuse(config, "attention_bias", (False,), where, "jaxtrain's LLaMA has no biases")
    _refuse(config, "mlp_bias", (False,), where, "jaxtrain's LLaMA has no biases")
    _refuse(config, "hidden_act", ("silu",), where, "SwiGLU")
    _refuse(config, "sliding_window", (None,), where, "attention over the whole context")
    _refuse(config, "use_sliding_window", (False,), where, "attention over the whole context")
    theta, scaling = _rope(config, where)
    stored = _stored(config, where)
    try:
        if "ffn_dim_multiplier" in stored and "multiple_of" in stored:
            multiplier, multiple_of = float(stored["ffn_dim_multiplier"]), int(stored["multiple_of"])
        else:  # multiple_of = F rounds any multiplier in (0, F / hidden] up to F (docs/formats.md §2c)
            multiplier, multiple_of = F / int(2 * (4 * C) / 3), F
        max_gen_batch_size = int(stored.get("max_gen_batch_size", 4))
    except (TypeError, ValueError):
        expected = "numbers, as llmc_io writes them"
        raise LLMCFormatError(where, "config.json llmc_header", expected, stored) from None
    rope = {}
    if scaling:
        rope = dict(
            rope_factor=float(scaling["factor"]),
            rope_low_freq_factor=float(scaling["low_freq_factor"]),
            rope_high_freq_factor=float(scaling["high_freq_factor"]),
            rope_original_max_seq_len=int(scaling["original_max_position_embeddings"]),
        )
    header = LLaMA3Header(
        T,
        V,
        L,
        N,
        K,
        C,
        multiplier,
        multiple_of,
        _float(config, "rms_norm_eps", 1e-5, where),
        theta,
        bool(scaling),
        max_gen_batch_size,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        **rope,
    )
    if header.ffn_hidden_dim != F:
        raise LLMCFormatError(where, "config.json intermediate_size", header.ffn_hidden_dim, F)
    return header


def header_from_config(config: dict, where) -> GPT2Header | LLaMA3Header:
    kind = config.get("model_type")
    if kind == "gpt2":
        return gpt2_header(config, where)
    if kind == "llama":
        return llama3_header(config, where)
    raise LLMCFormatError(where, "config.json model_type", "gpt2 or llama", kind)


def hf_header(directory: str | os.PathLike) -> GPT2Header | LLaMA3Header:
    """The model an HF folder's config.json describes, its tensors unread."""
    return header_from_config(read_config(directory), Path(directory) / CONFIG_FILE)


def _token_or_none(token_id: int, vocab_size: int):
    """The family's special id where the vocabulary has it (transformers warns otherwise)."""
    return token_id if token_id < vocab_size else None


def special_tokens(header) -> dict:
    if isinstance(header, GPT2Header):
        bos = eos = _token_or_none(GPT2_EOT, header.vocab_size)
    else:
        bos, eos = (
            _token_or_none(LLAMA3_BOS, header.vocab_size),
            _token_or_none(LLAMA3_EOT, header.vocab_size),
        )
    return {"bos_token_id": bos, "eos_token_id": eos}


def gpt2_config(header: GPT2Header, dtype: str) -> dict:
    return {
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
        **special_tokens(header),
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "llmc_header": {"padded_vocab_size": header.padded_vocab_size},
    }


def rope_scaling(header: LLaMA3Header) -> tuple | None:
    """(factor, low_freq_factor, high_freq_factor, original context) when RoPE is scaled."""
    if not header.use_scaled_rope:
        return None
    fields = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len")
    return tuple(getattr(header, name) for name in fields)


def llama3_config(header: LLaMA3Header, dtype: str) -> dict:
    scaling = rope_scaling(header)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": header.vocab_size,
        "hidden_size": header.channels,
        "intermediate_size": header.ffn_hidden_dim,
        "num_hidden_layers": header.num_layers,
        "num_attention_heads": header.num_heads,
        "num_key_value_heads": header.num_kv_heads,
        "head_dim": header.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": header.max_seq_len,
        # The header holds fp32 (1e-5 as 9.99999975e-06); the shortest decimal of it is what the
        # source config said, and transformers computes in fp32 either way.
        "rms_norm_eps": float(fp32_repr(header.norm_eps)),
        "rope_theta": float(fp32_repr(header.rope_theta)),
        "rope_scaling": {"rope_type": "llama3", **dict(zip(_ROPE_KEYS, scaling))} if scaling else None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": header.tie_embeddings,
        **special_tokens(header),
        "torch_dtype": dtype,
        "llmc_header": {
            "ffn_dim_multiplier": header.ffn_dim_multiplier,
            "multiple_of": header.multiple_of,
            "max_gen_batch_size": header.max_gen_batch_size,
        },
    }


def generation_config(header) -> dict:
    """generation_config.json as save_pretrained writes it from a model's config."""
    return {"_from_model_config": True, **special_tokens(header)}
