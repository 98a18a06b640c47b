"""`ckpt check-hf HF_DIR [--against CHECKPOINT]`: does a Hugging Face folder compute what jaxtrain
computes? A few token sequences go through the jaxtrain model (on the CHECKPOINT's weights, or on the
folder's as --init_from reads them) and through the folder itself: transformers' model where
transformers is installed, else the NumPy forward below, written from transformers' modeling code
(LlamaForCausalLM: nn.Linear (out, in) weights, rotate_half RoPE with the llama3 scaling, GQA,
SwiGLU; GPT2LMHeadModel: Conv1D (in, out) weights, the tanh GELU, the head tied to wte). It prints
the largest logit difference, and exits 1 above --atol.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

_ROPE_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')


def check_tokens(vocab_size: int, max_seq_len: int, seed: int = 0) -> np.ndarray:
    """(2, T) token ids, T = min(16, context): what both sides run."""
    return np.random.default_rng(seed).integers(0, vocab_size, (2, min(16, max_seq_len)))


def _inverse_frequencies(config: dict, head_dim: int) -> np.ndarray:
    """transformers' _compute_llama3_parameters (or the default RoPE) in float64."""
    inv = 1.0 / config['rope_theta'] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get('rope_scaling')
    if not scaling:
        return inv
    factor, low, high, context = (float(scaling[k]) for k in _ROPE_KEYS)
    wavelength = 2 * math.pi / inv
    smooth = (context / wavelength - low) / (high - low)
    mid = (1 - smooth) * inv / factor + smooth * inv
    scaled = np.where(wavelength > context / low, inv / factor, inv)
    is_mid = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(is_mid, mid, scaled)


def _attend(q_BxNxTxH, k_BxNxTxH, v_BxNxTxH) -> np.ndarray:
    T, H = q_BxNxTxH.shape[2], q_BxNxTxH.shape[3]
    scores = np.einsum('bnth,bnsh->bnts', q_BxNxTxH, k_BxNxTxH) / math.sqrt(H)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum('bnts,bnsh->bnth', weights, v_BxNxTxH)
    return out.transpose(0, 2, 1, 3).reshape(out.shape[0], T, -1)


def llama_forward(weight, config: dict, tokens_BxT) -> np.ndarray:
    """LlamaForCausalLM's logits; `weight(name)` gives a folder tensor as float64."""
    B, T = tokens_BxT.shape
    N, eps = config['num_attention_heads'], config['rms_norm_eps']
    K, H = config.get('num_key_value_heads') or N, config['hidden_size'] // N
    angles = np.arange(T)[:, None] * _inverse_frequencies(config, H)[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))

    def norm(x, name):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * weight(name)

    def heads(x, n, name, rotate):
        y = (x @ weight(name).T).reshape(B, T, n, H).transpose(0, 2, 1, 3)
        if not rotate:
            return np.repeat(y, N // n, axis=1)
        half = np.concatenate([-y[..., H // 2 :], y[..., : H // 2]], -1)
        return np.repeat(y * cos + half * sin, N // n, axis=1)

    x = weight('model.embed_tokens.weight')[tokens_BxT]
    for i in range(config['num_hidden_layers']):
        p = f'model.layers.{i}.'
        h = norm(x, p + 'input_layernorm.weight')
        q, k = (
            heads(h, N, p + 'self_attn.q_proj.weight', True),
            heads(h, K, p + 'self_attn.k_proj.weight', True),
        )
        x = (
            x
            + _attend(q, k, heads(h, K, p + 'self_attn.v_proj.weight', False))
            @ weight(p + 'self_attn.o_proj.weight').T
        )
        h = norm(x, p + 'post_attention_layernorm.weight')
        gate = h @ weight(p + 'mlp.gate_proj.weight').T
        x = (
            x
            + ((gate / (1 + np.exp(-gate))) * (h @ weight(p + 'mlp.up_proj.weight').T))
            @ weight(p + 'mlp.down_proj.weight').T
        )
    head = 'model.embed_tokens.weight' if config.get('tie_word_embeddings') else 'lm_head.weight'
    return norm(x, 'model.norm.weight') @ weight(head).T


def gpt2_forward(weight, config: dict, tokens_BxT) -> np.ndarray:
    """GPT2LMHeadModel's logits (tensor names with or without the `transformer.` prefix)."""
    B, T = tokens_BxT.shape
    N = config['n_head']

    def w(name):
        return weight(name)

    def layer_norm(x, name):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + config.get('layer_norm_epsilon', 1e-5)) * w(name + '.weight') + w(
            name + '.bias'
        )

    def conv1d(x, name):
        return x @ w(name + '.weight') + w(name + '.bias')

    x = w('transformer.wte.weight')[tokens_BxT] + w('transformer.wpe.weight')[:T]
    for i in range(config['n_layer']):
        p = f'transformer.h.{i}.'
        qkv = conv1d(layer_norm(x, p + 'ln_1'), p + 'attn.c_attn')
        q, k, v = (a.reshape(B, T, N, -1).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
        x = x + conv1d(_attend(q, k, v), p + 'attn.c_proj')
        h = conv1d(layer_norm(x, p + 'ln_2'), p + 'mlp.c_fc')
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
        x = x + conv1d(h, p + 'mlp.c_proj')
    return layer_norm(x, 'transformer.ln_f') @ w('transformer.wte.weight').T


def numpy_logits(folder, tokens_BxT) -> np.ndarray:
    from llmc_io.hf.config import read_config
    from llmc_io.hf.weights import FolderTensors

    config, tensors = read_config(folder), FolderTensors(folder)
    loaded: dict = {}

    def weight(name):
        if name not in loaded:
            stored = (
                name
                if name in tensors or not name.startswith('transformer.')
                else name[len('transformer.') :]
            )
            loaded[name] = np.asarray(tensors.pop(stored), np.float64)
        return loaded[name]

    forward = gpt2_forward if config.get('model_type') == 'gpt2' else llama_forward
    return forward(weight, config, np.asarray(tokens_BxT))


def transformers_logits(folder, tokens_BxT):
    """The folder's logits through transformers (fp32, CPU), or None where it is not installed."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens_BxT))).logits.double().numpy()


def jaxtrain_logits(weights, tokens_BxT) -> np.ndarray:
    """The jaxtrain model's fp32 logits over the vocabulary on `weights` (init_from.read_weights)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain.models import FAMILIES
    from jaxtrain.tools.generate import _model_config

    config = _model_config(weights)
    model_cls = FAMILIES[weights.family][0]
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))), nnx.Param)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), weights.params)
    logits = nnx.merge(graphdef, nnx.State(params))(jnp.asarray(tokens_BxT))
    return np.asarray(logits, np.float64)[..., : config.vocab_size]


def check_hf(folder, against: str = '') -> dict:
    """{'max_abs_diff', 'max_abs_logit', 'reference', 'jaxtrain', 'tokens'} for the report."""
    from jaxtrain.checkpoint.resume import read_weights
    from llmc_io.hf.config import hf_header

    folder = Path(folder)
    header = hf_header(folder)
    weights = read_weights(against or folder, '--against' if against else 'HF_DIR', lora_base='')
    tokens = check_tokens(header.vocab_size, header.max_seq_len)
    ours = jaxtrain_logits(weights, tokens)
    theirs = transformers_logits(folder, tokens)
    reference = 'transformers' if theirs is not None else 'the NumPy forward of transformers\' model'
    if theirs is None:
        theirs = numpy_logits(folder, tokens)
    theirs = theirs[..., : header.vocab_size]
    if ours.shape != theirs.shape:
        raise ValueError(
            f'{folder}: logits: expected shape {theirs.shape} from {weights.what}, found {ours.shape}'
        )
    return {
        'max_abs_diff': float(np.max(np.abs(ours - theirs))),
        'max_abs_logit': float(np.max(np.abs(theirs))),
        'reference': reference,
        'jaxtrain': weights.what,
        'tokens': list(tokens.shape),
    }


def check_line(folder, result: dict) -> str:
    return (
        f"{folder}: largest logit difference {result['max_abs_diff']:.3g} (largest logit "
        f"{result['max_abs_logit']:.3g}) over {result['tokens'][0]} x {result['tokens'][1]} tokens: "
        f"jaxtrain on {result['jaxtrain']} against {result['reference']}"
    )


def cmd_check_hf(args) -> int:
    import json

    result = check_hf(args.hf_dir, args.against)
    passed = result['max_abs_diff'] <= args.atol
    if args.json:
        print(json.dumps({'path': str(args.hf_dir), **result, 'atol': args.atol, 'passed': passed}))
    else:
        print(check_line(args.hf_dir, result) + ('' if passed else f'; above --atol {args.atol}'))
    return 0 if passed else 1
