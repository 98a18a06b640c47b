"""An independent NumPy reference forward pass for GPT-2 and LLaMA-3, in float64.

Written from docs/formats.md (§1, §2c) and llm.c's semantics, not from the Flax models, so that model tests
compare two implementations rather than one implementation with itself. Parameters are the trees of
llmc_io/PARAMS_SPEC.md: nested dicts (or flat dicts keyed 'h/ln_1/scale'), Linear kernels (in, out), per-layer
tensors stacked over L on axis 0.

Axis letters: B batch, T time, C channels, H heads, K kv heads, D head dim, F MLP hidden, V vocab.
"""

from __future__ import annotations

import math

import numpy as np


def _param(params, name: str) -> np.ndarray:
    """params['h']['ln_1']['scale'] for name 'h/ln_1/scale'; a flat dict keyed by the name also works."""
    if name in params:
        return np.asarray(params[name], np.float64)
    node = params
    for key in name.split("/"):
        node = node[key]
    return np.asarray(node, np.float64)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _causal_attention(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD) -> np.ndarray:
    """Causal softmax attention scaled by 1/sqrt(D); returns (B, T, H*D)."""
    B, T, H, D = q_BxTxHxD.shape
    scores_BxHxTxT = np.einsum("bthd,bshd->bhts", q_BxTxHxD, k_BxTxHxD) / math.sqrt(D)
    future = np.triu(np.ones((T, T), bool), k=1)
    scores_BxHxTxT = np.where(future, -np.inf, scores_BxHxTxT)
    y_BxTxHxD = np.einsum("bhts,bshd->bthd", _softmax(scores_BxHxTxT), v_BxTxHxD)
    return y_BxTxHxD.reshape(B, T, H * D)


# ---- GPT-2 ----------------------------------------------------------------------------------------


def layer_norm(x, scale, bias, eps: float = 1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # population variance, as llm.c and torch
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gpt2_logits(params, num_heads: int, tokens) -> np.ndarray:
    """(B, T, Vp) logits of llm.c's GPT-2: learned positions, pre-LayerNorm, tied head over all Vp rows."""
    tokens_BxT = np.asarray(tokens)
    B, T = tokens_BxT.shape
    wte_VpxC = _param(params, "wte/embedding")
    C = wte_VpxC.shape[1]
    D = C // num_heads
    x_BxTxC = wte_VpxC[tokens_BxT] + _param(params, "wpe/embedding")[:T]
    num_layers = _param(params, "h/ln_1/scale").shape[0]
    for layer in range(num_layers):
        p = lambda name: _param(params, "h/" + name)[layer]  # noqa: E731  (this layer's slice)
        h = layer_norm(x_BxTxC, p("ln_1/scale"), p("ln_1/bias"))
        qkv_BxTx3C = h @ p("attn/c_attn/kernel") + p("attn/c_attn/bias")
        q, k, v = (qkv_BxTx3C[..., i * C : (i + 1) * C].reshape(B, T, num_heads, D) for i in range(3))
        x_BxTxC = x_BxTxC + _causal_attention(q, k, v) @ p("attn/c_proj/kernel") + p("attn/c_proj/bias")
        h = layer_norm(x_BxTxC, p("ln_2/scale"), p("ln_2/bias"))
        h_BxTxF = gelu_tanh(h @ p("mlp/c_fc/kernel") + p("mlp/c_fc/bias"))
        x_BxTxC = x_BxTxC + h_BxTxF @ p("mlp/c_proj/kernel") + p("mlp/c_proj/bias")
    x_BxTxC = layer_norm(x_BxTxC, _param(params, "ln_f/scale"), _param(params, "ln_f/bias"))
    return x_BxTxC @ wte_VpxC.T


# ---- LLaMA-3 --------------------------------------------------------------------------------------


def rms_norm(x, scale, eps: float):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope_frequencies(head_dim: int, theta: float, use_scaled_rope: bool = False, scaling=None) -> np.ndarray:
    """(head_dim/2,) angular frequencies freq_i = theta^(-2i/head_dim), with llm.c's Llama-3.1 scaling
    (or `scaling` = (factor, low_freq_factor, high_freq_factor, original context), HF's llama3 type)."""
    freqs = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not use_scaled_rope and scaling is None:
        return freqs
    factor, low_freq_factor, high_freq_factor, old_context = scaling or (8.0, 1.0, 4.0, 8192.0)
    low_freq_wavelen = old_context / low_freq_factor  # 8192: longer wavelengths are slowed by 8
    high_freq_wavelen = old_context / high_freq_factor  # 2048: shorter wavelengths are kept
    scaled = []
    for f in freqs:
        wavelen = 2.0 * math.pi / f
        if wavelen < high_freq_wavelen:
            scaled.append(f)
        elif wavelen > low_freq_wavelen:
            scaled.append(f / factor)
        else:
            smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            scaled.append((1.0 - smooth) * f / factor + smooth * f)
    return np.array(scaled, np.float64)


def apply_rope(x_BxTxHxD, freqs_D2) -> np.ndarray:
    """Rotate interleaved pairs (2i, 2i+1) of each head by angle t * freq_i (Meta's order)."""
    T = x_BxTxHxD.shape[1]
    angle_TxD2 = np.arange(T, dtype=np.float64)[:, None] * freqs_D2[None, :]
    cos = np.cos(angle_TxD2)[None, :, None, :]
    sin = np.sin(angle_TxD2)[None, :, None, :]
    a, b = x_BxTxHxD[..., 0::2], x_BxTxHxD[..., 1::2]
    out = np.empty_like(x_BxTxHxD)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def llama3_logits(
    params,
    num_heads: int,
    num_kv_heads: int,
    tokens,
    rope_theta: float,
    norm_eps: float,
    use_scaled_rope: bool = False,
) -> np.ndarray:
    """(B, T, V) logits of llm.c's LLaMA-3: RMSNorm, interleaved RoPE, GQA, SwiGLU, untied lm_head."""
    tokens_BxT = np.asarray(tokens)
    B, T = tokens_BxT.shape
    wte_VxC = _param(params, "wte/embedding")
    C = wte_VxC.shape[1]
    D = C // num_heads
    kv = num_kv_heads * D
    group = num_heads // num_kv_heads
    freqs = rope_frequencies(D, rope_theta, use_scaled_rope)
    x_BxTxC = wte_VxC[tokens_BxT]
    num_layers = _param(params, "h/ln_1/scale").shape[0]
    for layer in range(num_layers):
        p = lambda name: _param(params, "h/" + name)[layer]  # noqa: E731  (this layer's slice)
        h = rms_norm(x_BxTxC, p("ln_1/scale"), norm_eps)
        qkv = h @ p("attn/c_attn/kernel")
        q_BxTxHxD = apply_rope(qkv[..., :C].reshape(B, T, num_heads, D), freqs)
        k_BxTxKxD = apply_rope(qkv[..., C : C + kv].reshape(B, T, num_kv_heads, D), freqs)
        v_BxTxKxD = qkv[..., C + kv :].reshape(B, T, num_kv_heads, D)
        # Query head h reads kv head h // group: repeat each kv head `group` times, adjacent.
        k_BxTxHxD = np.repeat(k_BxTxKxD, group, axis=2)
        v_BxTxHxD = np.repeat(v_BxTxKxD, group, axis=2)
        x_BxTxC = x_BxTxC + _causal_attention(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD) @ p("attn/c_proj/kernel")
        h = rms_norm(x_BxTxC, p("ln_2/scale"), norm_eps)
        h_BxTxF = (h @ p("mlp/c_fc/kernel")) * silu(h @ p("mlp/c_fc2/kernel"))
        x_BxTxC = x_BxTxC + h_BxTxF @ p("mlp/c_proj/kernel")
    x_BxTxC = rms_norm(x_BxTxC, _param(params, "ln_f/scale"), norm_eps)
    return x_BxTxC @ _param(params, "lm_head/kernel")


def hf_llama_logits(tensors: dict, config: dict, tokens) -> np.ndarray:
    """(B, T, V) logits of transformers' LlamaForCausalLM from its own tensor names and config.json:
    nn.Linear (out, in) weights, RoPE on the two halves of a head (rotate_half), GQA, SwiGLU, the
    head tied to embed_tokens when config.json says so."""
    t = lambda name: np.asarray(tensors[name], np.float64)  # noqa: E731
    tokens_BxT = np.asarray(tokens)
    B, T = tokens_BxT.shape
    N, K, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    D = config["hidden_size"] // N
    scaling = config.get("rope_scaling")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    freqs = rope_frequencies(D, config["rope_theta"], scaling=scaling and tuple(scaling[k] for k in keys))
    angle_TxD = np.concatenate([np.arange(T)[:, None] * freqs[None, :]] * 2, axis=1)
    cos, sin = np.cos(angle_TxD)[None, None], np.sin(angle_TxD)[None, None]

    def rope(x_BxHxTxD):
        half = x_BxHxTxD.shape[-1] // 2
        rotated = np.concatenate([-x_BxHxTxD[..., half:], x_BxHxTxD[..., :half]], axis=-1)
        return x_BxHxTxD * cos + rotated * sin

    x = t("model.embed_tokens.weight")[tokens_BxT]
    for i in range(config["num_hidden_layers"]):
        w = lambda name: t(f"model.layers.{i}.{name}.weight")  # noqa: E731
        h = rms_norm(x, w("input_layernorm"), eps)
        q = rope((h @ w("self_attn.q_proj").T).reshape(B, T, N, D).transpose(0, 2, 1, 3))
        k = rope((h @ w("self_attn.k_proj").T).reshape(B, T, K, D).transpose(0, 2, 1, 3))
        v = (h @ w("self_attn.v_proj").T).reshape(B, T, K, D).transpose(0, 2, 1, 3)
        k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)
        y = (_softmax(att) @ v).transpose(0, 2, 1, 3).reshape(B, T, N * D)
        x = x + y @ w("self_attn.o_proj").T
        h = rms_norm(x, w("post_attention_layernorm"), eps)
        x = x + ((h @ w("mlp.up_proj").T) * silu(h @ w("mlp.gate_proj").T)) @ w("mlp.down_proj").T
    head = "model.embed_tokens.weight" if config.get("tie_word_embeddings") else "lm_head.weight"
    return rms_norm(x, t("model.norm.weight"), eps) @ t(head).T


# ---- loss -----------------------------------------------------------------------------------------


def cross_entropy(logits, targets, vocab_size: int) -> float:
    """Mean next-token cross-entropy over the first vocab_size columns (GPT-2's Vp padding is ignored)."""
    logits_NxV = np.asarray(logits, np.float64)[..., :vocab_size].reshape(-1, vocab_size)
    targets_N = np.asarray(targets).reshape(-1)
    shifted = logits_NxV - logits_NxV.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(len(targets_N)), targets_N].mean())
