"""LLaMA-3 as InfiniTrain defines it (docs/formats.md §2c), in Flax NNX.

Axis letters: B batch, T time, C channels, N query heads, K key/value heads, H head dim,
F FFN hidden, V vocab.

RMSNorm in fp32, RoPE on interleaved pairs (2i, 2i+1) with `rope_theta` and optional
Llama-3.1 frequency scaling, grouped-query attention, SwiGLU (`c_fc` up, `c_fc2` gate,
`c_proj` down), no biases, and an untied `lm_head`, or with `tie_embeddings` (Llama-3.2-1B and
3B) none: the head is wte, one tensor trained as GPT-2's is. Blocks are stacked and scanned, as
in gpt2.py.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.models.attention import causal_attention
from jaxtrain.models.vocab_table import embedding_lookup
from jaxtrain.models.layer_stack import OFF, Recompute, apply_blocks, stack_blocks
from jaxtrain.models.lora import linear
from jaxtrain.models.precision_check import tap  # no-op unless --precision_check
from jaxtrain.parallel.sharding import split_over_time  # no-op unless --sequence_parallel


@dataclasses.dataclass(frozen=True)
class LLaMA3Config:
    """Hyperparameters; field names match llmc_io.LLaMA3Header so a file header maps 1:1."""

    max_seq_len: int = 8192
    vocab_size: int = 128256
    num_layers: int = 16
    num_heads: int = 32
    num_kv_heads: int = 8
    channels: int = 2048
    ffn_dim_multiplier: float = 1.4
    multiple_of: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = True
    max_gen_batch_size: int = 4
    tie_embeddings: bool = False
    # Llama-3.1's scaling when use_scaled_rope; Llama-3.2 takes factor 32 (HF's rope_scaling).
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192

    def __post_init__(self):
        if self.channels % self.num_heads:
            raise ValueError(f'channels ({self.channels}) must be a multiple of num_heads ({self.num_heads})')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})'
            )

    @property
    def head_dim(self) -> int:
        return self.channels // self.num_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """docs/formats.md §2c: 4C, then 2/3 of it, times the multiplier, rounded up to multiple_of."""
        hidden = int(2 * (4 * self.channels) / 3)
        if self.ffn_dim_multiplier > 0:  # 0 means "no multiplier", as InfiniTrain writes it
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def num_parameters(self) -> int:
        C, L, F = self.channels, self.num_layers, self.ffn_hidden_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = C + C * (C + 2 * kv) + C * C + C + 3 * C * F
        return (1 if self.tie_embeddings else 2) * self.vocab_size * C + L * per_layer + C

    @property
    def rope_scaling(self) -> tuple[float, float, float, int] | None:
        if not self.use_scaled_rope:
            return None
        return (
            self.rope_factor,
            self.rope_low_freq_factor,
            self.rope_high_freq_factor,
            self.rope_original_max_seq_len,
        )


VARIANTS = {
    # Tests and smoke runs: the real LLaMA-3 vocabulary so any LLaMA-3 shard fits.
    'tiny': LLaMA3Config(
        max_seq_len=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        channels=64,
        ffn_dim_multiplier=1.0,
        multiple_of=32,
        use_scaled_rope=False,
    ),
    # A quick GPU-sized member of the family (about 155M parameters, most in wte and lm_head).
    'small': LLaMA3Config(
        max_seq_len=2048,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        channels=512,
        ffn_dim_multiplier=1.0,
        multiple_of=256,
        use_scaled_rope=False,
    ),
    'llama3.2-1b': LLaMA3Config(),
    # InfiniTrain's --model llama3 (example/llama3/config.h at b24d92f): the 1B shape with
    # its own FFN rounding (same hidden size 8192) and unscaled RoPE.
    'llama3': LLaMA3Config(ffn_dim_multiplier=1.5, multiple_of=256, use_scaled_rope=False),
    'llama3-8b': LLaMA3Config(
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        channels=4096,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        use_scaled_rope=False,
    ),
}


def rope_frequencies(head_dim: int, theta: float, scaling) -> np.ndarray:
    """freq_i = theta^(-2i/H) for i < H/2, with Llama-3.1's long-context scaling when `scaling` is
    (factor, low_freq_factor, high_freq_factor, original context), None for none."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return freqs
    factor, low_freq_factor, high_freq_factor, old_context = (float(v) for v in scaling)
    low_wavelen, high_wavelen = old_context / low_freq_factor, old_context / high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    return np.where(wavelen < high_wavelen, freqs, np.where(wavelen > low_wavelen, freqs / factor, blended))


def apply_rope(x_BxTxNxH, cos_TxH2, sin_TxH2):
    """Rotates the interleaved pairs (x[2i], x[2i+1]) by angle t·freq_i (Meta's order)."""
    a, b = x_BxTxNxH[..., 0::2], x_BxTxNxH[..., 1::2]
    cos, sin = cos_TxH2[None, :, None, :], sin_TxH2[None, :, None, :]
    rotated = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return rotated.reshape(x_BxTxNxH.shape).astype(x_BxTxNxH.dtype)


class RMSNorm(nnx.Module):
    """x·rsqrt(mean(x²)+eps)·w, always in fp32 (InfiniTrain and llm.c do the same)."""

    def __init__(self, dim: int, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps) * self.scale[...]


def _linear(n_in, n_out, dtype, rngs, lora=None, module=''):
    return linear(
        lora,
        module,
        n_in,
        n_out,
        use_bias=False,
        kernel_init=nnx.initializers.normal(0.02),
        dtype=dtype,
        rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, config: LLaMA3Config, dtype, attention: str, rngs: nnx.Rngs, lora=None):
        C, kv = config.channels, config.num_kv_heads * config.head_dim
        self.c_attn = _linear(C, C + 2 * kv, dtype, rngs, lora, 'attn.c_attn')
        self.c_proj = _linear(C, C, dtype, rngs, lora, 'attn.c_proj')
        self.config = config
        self.attention = attention

    def __call__(self, x_BxTxC, cos_TxH2, sin_TxH2):
        B, T, C = x_BxTxC.shape
        N, K, H = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        qkv = self.c_attn(x_BxTxC)
        q_BxTxNxH = qkv[..., :C].reshape(B, T, N, H)
        k_BxTxKxH = qkv[..., C : C + K * H].reshape(B, T, K, H)
        v_BxTxKxH = qkv[..., C + K * H :].reshape(B, T, K, H)
        q_BxTxNxH = apply_rope(q_BxTxNxH, cos_TxH2, sin_TxH2)
        k_BxTxKxH = apply_rope(k_BxTxKxH, cos_TxH2, sin_TxH2)
        y_BxTxNxH = causal_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, self.attention)
        return self.c_proj(y_BxTxNxH.reshape(B, T, C))


class SwiGLU(nnx.Module):
    def __init__(self, config: LLaMA3Config, dtype, rngs: nnx.Rngs, lora=None):
        C, F = config.channels, config.ffn_hidden_dim
        self.c_fc = _linear(C, F, dtype, rngs, lora, 'mlp.c_fc')  # up (Meta w3)
        self.c_fc2 = _linear(C, F, dtype, rngs, lora, 'mlp.c_fc2')  # gate (Meta w1)
        self.c_proj = _linear(F, C, dtype, rngs, lora, 'mlp.c_proj')  # down (Meta w2)

    def __call__(self, x_BxTxC):
        return self.c_proj(self.c_fc(x_BxTxC) * jax.nn.silu(self.c_fc2(x_BxTxC)))


class Block(nnx.Module):
    def __init__(self, config: LLaMA3Config, dtype, attention: str, rngs: nnx.Rngs, lora=None):
        self.ln_1 = RMSNorm(config.channels, config.norm_eps)
        self.attn = Attention(config, dtype, attention, rngs, lora)
        self.ln_2 = RMSNorm(config.channels, config.norm_eps)
        self.mlp = SwiGLU(config, dtype, rngs, lora)
        self.dtype = dtype

    def __call__(self, x_BxTxC, cos_TxH2, sin_TxH2):
        attended = self.attn(self.ln_1(x_BxTxC).astype(self.dtype), cos_TxH2, sin_TxH2)
        x_BxTxC = split_over_time(x_BxTxC + tap('CausalSelfAttention', attended))
        mixed = tap('MLP', self.mlp(self.ln_2(x_BxTxC).astype(self.dtype)))
        return tap('Block', split_over_time(x_BxTxC + mixed))


class LLaMA3(nnx.Module):
    """Returns logits over the vocabulary V (LLaMA-3's 128256 needs no padding)."""

    def __init__(
        self,
        config: LLaMA3Config,
        *,
        dtype=jnp.float32,
        attention: str = 'xla',
        scan_layers: bool = True,
        deterministic: bool = True,
        recompute: Recompute = OFF,
        lora=None,  # a lora.LoRASpec: adapters on the projections it targets
        rngs: nnx.Rngs,
    ):
        self.config = config
        C, V = config.channels, config.vocab_size
        self.wte = nnx.Embed(V, C, embedding_init=nnx.initializers.normal(0.02), dtype=dtype, rngs=rngs)

        self.h = stack_blocks(
            config.num_layers, lambda rngs: Block(config, dtype, attention, rngs, lora), rngs
        )
        self.ln_f = RMSNorm(C, config.norm_eps)
        if not config.tie_embeddings:
            self.lm_head = _linear(C, V, dtype, rngs)
        self.dtype = dtype
        self.scan_layers = scan_layers
        self.recompute = recompute  # which layers' activations are recomputed in the backward pass
        # Bitwise-reproducible gradients where a kernel choice decides it (the embedding's).
        self.deterministic = deterministic

    def features(self, tokens_BxT):
        """The final hidden states (after ln_f) in the compute dtype."""
        T = tokens_BxT.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f'sequence_length {T} exceeds the model max_seq_len {self.config.max_seq_len}')
        freqs_H2 = rope_frequencies(self.config.head_dim, self.config.rope_theta, self.config.rope_scaling)
        angles_TxH2 = np.arange(T, dtype=np.float64)[:, None] * freqs_H2[None, :]
        # Angles in float64 on the host, then fp32: the same tables on every backend.
        cos_TxH2 = jnp.asarray(np.cos(angles_TxH2), jnp.float32)
        sin_TxH2 = jnp.asarray(np.sin(angles_TxH2), jnp.float32)

        # Not nnx.Embed's gather: see vocab_table.py for the deterministic gradient.
        x_BxTxC = embedding_lookup(self.wte.embedding[...], tokens_BxT, self.deterministic).astype(self.dtype)
        x_BxTxC = apply_blocks(
            self.h,
            x_BxTxC,
            cos_TxH2,
            sin_TxH2,
            scan=self.scan_layers,
            distinct_attention=self.deterministic,
            recompute=self.recompute,
        )
        return self.ln_f(x_BxTxC).astype(self.dtype)

    def head_weight(self):
        """(weight, vocab_axis) of the output head: lm_head's kernel (C, V), or tied wte (V, C)."""
        if self.config.tie_embeddings:
            return self.wte.embedding[...], 0
        return self.lm_head.kernel[...], 1

    def head(self, h_BxTxC):
        return self.wte.attend(h_BxTxC) if self.config.tie_embeddings else self.lm_head(h_BxTxC)

    def __call__(self, tokens_BxT):
        return self.head(self.features(tokens_BxT))
