"""GPT-2 exactly as llm.c defines it, in Flax NNX.

Axis letters: B batch, T time, C channels, N heads, H head dim (C/N), V padded vocab (Vp).

llm.c semantics: learned positions, pre-LayerNorm (eps 1e-5), tanh-GELU, biases, fused
qkv `c_attn`, vocabulary padded to Vp with the loss over the real V only, and the output
head tied to `wte` *by construction*: logits are `wte.attend(h)`, so there is one
parameter and a resumed run cannot drift apart from an untied copy (InfiniTrain's bug).

The L blocks are created stacked (each parameter has a leading L axis, like llm.c's file
layout) and applied with `lax.scan` (one compiled block) or unrolled (faster steps); see
layer_stack.py. With `fused_kernels` the residual adds, LayerNorms and the MLP's bias + GELU
run as Pallas kernels (layernorm_kernel.py, bias_gelu_kernel.py). The training loss does not
call the model: it takes `features` and `head_weight` into vocab_table.py, which never
materialises the full logits.

Two hand-written backward passes close the file. gelu_tanh: GPT-2's tanh-GELU, whose backward
recomputes from the input. Differentiated by autodiff, `jax.nn.gelu(x, approximate=True)` keeps
tanh(...) of the forward pass as a second residual beside x: at GPT-2 124M, batch 16 x 1024, the
forward fusion then writes two B·T·4C tensors (100 MB each in bf16) and the backward reads
three, per layer (an H200 profile of the step). Saving only x and recomputing tanh in the
backward (free in a memory-bound fusion) moves 200 MB less per layer. The forward values are
jax's own; the derivative is computed in fp32 and rounded once to x's dtype.

split_qkv: GPT-2's fused q|k|v projection split, with its gradient concatenated once. The
gradient of `jnp.split(qkv, 3)` is the concatenation of dq, dk and dv, which two matmuls read
(the weight gradient and the input gradient of c_attn). XLA fuses the concatenation into each of
them, so it runs twice: 2 x 35 us a layer at GPT-2 124M, batch 16 x 1024, on an H200. An
optimization barrier makes it one buffer that both read.
"""

import dataclasses
import math
import jax.numpy as jnp
from flax import nnx
from jax import lax
import jax

from jaxtrain.models.attention import causal_attention
from jaxtrain.models.bias_gelu_kernel import bias_gelu
from jaxtrain.models.vocab_table import embedding_lookup
from jaxtrain.models.layer_stack import OFF, Recompute, apply_blocks, stack_blocks
from jaxtrain.models.layernorm_kernel import add_layernorm
from jaxtrain.models.lora import LoRALinear, linear
from jaxtrain.models.precision_check import tap  # no-op unless --precision_check
from jaxtrain.parallel.sharding import split_over_time  # no-op unless --sequence_parallel


# --fused_kernels: which of the block's elementwise work runs as Pallas kernels instead of XLA's
# fusions (one GPU only; checks/fit_checks.py).
FUSED_KERNELS = ('none', 'layernorm', 'bias_gelu', 'all')


def _fuses(fused_kernels: str, kernel: str) -> bool:
    return fused_kernels in (kernel, 'all')


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Hyperparameters; field names match llmc_io.GPT2Header so a file header maps 1:1."""

    max_seq_len: int = 1024
    vocab_size: int = 50257
    padded_vocab_size: int = 50304
    num_layers: int = 12
    num_heads: int = 12
    channels: int = 768

    def __post_init__(self):
        if self.channels % self.num_heads:
            raise ValueError(f'channels ({self.channels}) must be a multiple of num_heads ({self.num_heads})')
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f'padded_vocab_size ({self.padded_vocab_size}) < vocab_size ({self.vocab_size})')

    @property
    def num_parameters(self) -> int:
        C, L = self.channels, self.num_layers
        return self.padded_vocab_size * C + self.max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C


VARIANTS = {
    # Tests and smoke runs: the real GPT-2 vocabulary so any GPT-2 shard fits.
    'tiny': GPT2Config(max_seq_len=256, num_layers=2, num_heads=4, channels=64),
    # The default offline run: big enough to learn visibly on 2 CPU cores in minutes.
    'small': GPT2Config(max_seq_len=1024, num_layers=4, num_heads=4, channels=256),
    'd12': GPT2Config(num_layers=12, num_heads=12, channels=768),  # 124M
    'd24': GPT2Config(num_layers=24, num_heads=16, channels=1024),  # 350M
    'd36': GPT2Config(num_layers=36, num_heads=20, channels=1280),  # 774M
    'd48': GPT2Config(num_layers=48, num_heads=25, channels=1600),  # 1558M
}
# InfiniTrain's --model names (example/gpt2/main.cc at b24d92f): the OpenAI sizes.
VARIANTS.update(
    {
        'gpt2': VARIANTS['d12'],
        'gpt2-medium': VARIANTS['d24'],
        'gpt2-large': VARIANTS['d36'],
        'gpt2-xl': VARIANTS['d48'],
    }
)


def _normal(std):
    return nnx.initializers.normal(stddev=std)


class CausalSelfAttention(nnx.Module):
    def __init__(self, config: GPT2Config, dtype, attention: str, rngs: nnx.Rngs, lora=None):
        C = config.channels
        # llm.c scales the init of residual projections by 1/sqrt(2L).
        proj_std = 0.02 / math.sqrt(2 * config.num_layers)
        self.c_attn = linear(lora, 'attn.c_attn', C, 3 * C, kernel_init=_normal(0.02), dtype=dtype, rngs=rngs)
        self.c_proj = linear(lora, 'attn.c_proj', C, C, kernel_init=_normal(proj_std), dtype=dtype, rngs=rngs)
        self.num_heads = config.num_heads
        self.attention = attention

    def __call__(self, x_BxTxC):
        B, T, C = x_BxTxC.shape
        N = self.num_heads
        q_BxTxC, k_BxTxC, v_BxTxC = split_qkv(self.c_attn(x_BxTxC))
        heads = lambda t: t.reshape(B, T, N, C // N)
        y_BxTxNxH = causal_attention(heads(q_BxTxC), heads(k_BxTxC), heads(v_BxTxC), self.attention)
        return self.c_proj(y_BxTxNxH.reshape(B, T, C))


class MLP(nnx.Module):
    def __init__(self, config: GPT2Config, dtype, rngs: nnx.Rngs, lora=None, fused_gelu=False):
        C = config.channels
        self.fused_gelu = fused_gelu
        proj_std = 0.02 / math.sqrt(2 * config.num_layers)
        self.c_fc = linear(lora, 'mlp.c_fc', C, 4 * C, kernel_init=_normal(0.02), dtype=dtype, rngs=rngs)
        self.c_proj = linear(
            lora, 'mlp.c_proj', 4 * C, C, kernel_init=_normal(proj_std), dtype=dtype, rngs=rngs
        )
        if fused_gelu and isinstance(self.c_fc, LoRALinear):
            # __call__ computes c_fc's matmul itself, from the base kernel: the adapters would be
            # silently dropped. checks/fit_checks.py refuses the flags; this guards other callers.
            raise ValueError(
                'fused_kernels: expected a plain mlp.c_fc with the bias_gelu kernel, found a LoRA '
                'adapter on it; pass --fused_kernels layernorm or none'
            )

    def __call__(self, x_BxTxC):
        if not self.fused_gelu:
            return self.c_proj(gelu_tanh(self.c_fc(x_BxTxC)))
        # c_fc's matmul as nnx.Linear computes it, its bias left to the kernel (which adds it
        # in fp32: c_fc is never a LoRALinear here, __init__ refuses one).
        fc = self.c_fc
        x_BxTxC, kernel_Cx4C, _ = fc.promote_dtype((x_BxTxC, fc.kernel[...], None), dtype=fc.dtype)
        contract = (((x_BxTxC.ndim - 1,), (0,)), ((), ()))
        pre_BxTx4C = lax.dot_general(x_BxTxC, kernel_Cx4C, contract, precision=fc.precision)
        return self.c_proj(bias_gelu(pre_BxTx4C, fc.bias[...]))


class Block(nnx.Module):
    def __init__(
        self, config: GPT2Config, dtype, attention: str, rngs: nnx.Rngs, lora=None, fused_kernels='none'
    ):
        C = config.channels
        # LayerNorm statistics in fp32 even in bf16 runs, as llm.c's kernels do.
        self.ln_1 = nnx.LayerNorm(C, epsilon=1e-5, dtype=jnp.float32, rngs=rngs)
        self.attn = CausalSelfAttention(config, dtype, attention, rngs, lora)
        self.ln_2 = nnx.LayerNorm(C, epsilon=1e-5, dtype=jnp.float32, rngs=rngs)
        self.mlp = MLP(config, dtype, rngs, lora, fused_gelu=_fuses(fused_kernels, 'bias_gelu'))
        self.dtype = dtype
        self.fused_layernorm = _fuses(fused_kernels, 'layernorm')

    def __call__(self, x_BxTxC):
        if self.fused_layernorm:
            return self._fused(x_BxTxC)
        attended = tap('CausalSelfAttention', self.attn(self.ln_1(x_BxTxC).astype(self.dtype)))
        x_BxTxC = split_over_time(x_BxTxC + attended)
        mixed = tap('MLP', self.mlp(self.ln_2(x_BxTxC).astype(self.dtype)))
        return tap('Block', split_over_time(x_BxTxC + mixed))

    def _fused(self, carry):
        """The block with each residual add fused into the LayerNorm that follows it.

        carry is (x, pending): the residual stream and the previous block's MLP output, not yet
        added. The add happens here, in ln_1's kernel, and this block's MLP output is handed on
        the same way, to the next block's ln_1 or to ln_f (GPT2.features): every add then
        shares a pass over memory with a LayerNorm. (One device only: no split_over_time.)
        """
        x_BxTxC, pending_BxTxC = carry
        x_BxTxC, normed = add_layernorm(x_BxTxC, pending_BxTxC, self.ln_1.scale[...], self.ln_1.bias[...])
        attended = tap('CausalSelfAttention', self.attn(normed))
        x_BxTxC, normed = add_layernorm(x_BxTxC, attended, self.ln_2.scale[...], self.ln_2.bias[...])
        return x_BxTxC, tap('MLP', self.mlp(normed))


class GPT2(nnx.Module):
    """Returns logits over the padded vocabulary Vp; the loss (vocab_table.py) ignores
    columns V..Vp-1."""

    def __init__(
        self,
        config: GPT2Config,
        *,
        dtype=jnp.float32,
        attention: str = 'xla',
        scan_layers: bool = True,
        deterministic: bool = True,
        recompute: Recompute = OFF,
        lora=None,  # a lora.LoRASpec: adapters on the projections it targets
        fused_kernels: str = 'none',  # one of FUSED_KERNELS
        rngs: nnx.Rngs,
    ):
        self.config = config
        C, V = config.channels, config.padded_vocab_size
        self.wte = nnx.Embed(V, C, embedding_init=_normal(0.02), dtype=dtype, rngs=rngs)
        # llm.c leaves the padding rows at zero; their gradient is zero, so they stay there.
        self.wte.embedding[...] = self.wte.embedding[...].at[config.vocab_size :].set(0.0)
        self.wpe = nnx.Embed(config.max_seq_len, C, embedding_init=_normal(0.02), dtype=dtype, rngs=rngs)

        self.h = stack_blocks(
            config.num_layers, lambda rngs: Block(config, dtype, attention, rngs, lora, fused_kernels), rngs
        )
        self.ln_f = nnx.LayerNorm(C, epsilon=1e-5, dtype=jnp.float32, rngs=rngs)
        self.dtype = dtype
        self.scan_layers = scan_layers
        self.recompute = recompute  # which layers' activations are recomputed in the backward pass
        # Bitwise-reproducible gradients where a kernel choice decides it (the embedding's).
        self.deterministic = deterministic
        self.fused_layernorm = _fuses(fused_kernels, 'layernorm')

    def features(self, tokens_BxT):
        """The final hidden states (after ln_f) in the compute dtype."""
        T = tokens_BxT.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f'sequence_length {T} exceeds the model max_seq_len {self.config.max_seq_len}')
        # Not nnx.Embed's gather: see vocab_table.py for the deterministic gradient. Positions
        # are a slice, whose gradient is a plain sum over the batch.
        x_BxTxC = embedding_lookup(self.wte.embedding[...], tokens_BxT, self.deterministic).astype(self.dtype)
        positions_1xTxC = self.wpe.embedding[:T].astype(self.dtype)[None]
        blocks = dict(scan=self.scan_layers, distinct_attention=self.deterministic, recompute=self.recompute)
        if self.fused_layernorm:
            # The position add is the first pending add (Block._fused), fused into ln_1's kernel.
            carry = (x_BxTxC, jnp.broadcast_to(positions_1xTxC, x_BxTxC.shape))
            x_BxTxC, pending_BxTxC = apply_blocks(self.h, carry, **blocks)
            return add_layernorm(x_BxTxC, pending_BxTxC, self.ln_f.scale[...], self.ln_f.bias[...])[1]
        x_BxTxC = apply_blocks(self.h, x_BxTxC + positions_1xTxC, **blocks)
        return self.ln_f(x_BxTxC).astype(self.dtype)

    def head_weight(self):
        """(weight, vocab_axis) of the output head: wte itself, (Vp, C)."""
        return self.wte.embedding[...], 0

    def __call__(self, tokens_BxT):
        return self.wte.attend(self.features(tokens_BxT))


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_CUBIC = 0.044715


@jax.custom_vjp
def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as jax.nn.gelu(approximate=True)."""
    return jax.nn.gelu(x, approximate=True)


def _gelu_forward(x):
    return gelu_tanh(x), x


def _gelu_backward(x, g):
    x32 = x.astype(jnp.float32)
    t = jnp.tanh(_SQRT_2_OVER_PI * (x32 + _CUBIC * x32 * x32 * x32))
    slope = 0.5 * (1 + t) + 0.5 * x32 * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _CUBIC * x32 * x32)
    return ((g.astype(jnp.float32) * slope).astype(g.dtype),)


gelu_tanh.defvjp(_gelu_forward, _gelu_backward)


@jax.custom_vjp
def split_qkv(qkv_BxTx3C):
    """(q, k, v), each (B, T, C), of the last axis in thirds, as jnp.split(qkv, 3, axis=-1)."""
    return tuple(jnp.split(qkv_BxTx3C, 3, axis=-1))


def _qkv_forward(qkv_BxTx3C):
    return split_qkv(qkv_BxTx3C), None


def _qkv_backward(_, grads):
    return (jax.lax.optimization_barrier(jnp.concatenate(grads, axis=-1)),)


split_qkv.defvjp(_qkv_forward, _qkv_backward)
