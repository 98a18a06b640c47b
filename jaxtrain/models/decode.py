"""Autoregressive decoding with a KV cache, for GPT-2 and LLaMA-3, compiled once.

Axis letters: B batch (samples), S positions (the fixed decoding length), C channels, N query
heads, K key/value heads, G = N/K query heads per kv head, H head dim, L layers, V vocab.

One jitted function runs the whole sequence: a `lax.fori_loop` over positions 0..S-2 feeds one
token per step through the blocks, appends that position's keys and values to a cache of fixed
shape (B, K, S, H) per layer, and attends over the positions filled so far. Prompt tokens are fed
the same way (teacher-forced: the sampled token is discarded while the prompt lasts), so the
prompt length is a traced value, not a shape, and new prompts, seeds and temperatures reuse the
one compilation. Only the batch size, S, top_k (lax.top_k needs a static k) and the
DecodeOptions are part of the compiled shape.

A position costs little arithmetic (one row of activations per sample against every weight), so
the time goes to launching kernels and reading weights. Hence, by default: the L blocks are
unrolled into straight-line code, each layer with its own params and its own cache arrays, which
the loop carries and XLA updates in place (a `lax.scan` over stacked layers is a nested loop, and
the stacked cache it takes and returns is copied whole at every position); and the weights that
the layers compute in the compute dtype are cast to it once, before the loop, not at every
position. DecodeOptions switches each of these, so that they can be measured against each other
(bench/decode_variants.py); every choice gives the same tokens.

The blocks are the models' own submodules (ln_1, c_attn, c_proj, mlp, ...), called here one
position at a time, so the models need no decoding code and any change to those layers (a
LoRA adapter on a projection) applies to decoding too. What is re-done here is only what
depends on the cache: attention over cached positions and the position embedding or RoPE
angle of one position. Works under the trainer's mesh: jit keeps the params' shardings.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.models.gpt2 import GPT2
from jaxtrain.models.llama3 import LLaMA3, apply_rope, rope_frequencies
from jaxtrain.parallel.sharding import put_global

# llm.c's sampling: train_gpt2.py samples at temperature 1.0 with top_k 40; train_gpt2.cu runs
# genT = 64 positions starting from EOT.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_K = 40
LAYERS = ('unrolled', 'scan')
TOP_K_METHODS = ('sort', 'select')


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How the loop is compiled; each choice gives the same tokens for the same key, except that
    in bfloat16 cast_params may round differently (XLA fuses the casts into their users
    differently) and so sample other tokens (bench/decode_variants.py checks both).

    layers: 'unrolled' runs the L blocks as straight-line code, each layer's params and cache
      arrays its own; 'scan' runs one compiled block in a lax.scan over the stacked params and a
      stacked (L, B, K, S, H) cache (shorter compilation for deep models, slower positions).
    positions_per_step: positions per iteration of the loop over positions (fori_loop's unroll):
      fewer loop trips, a longer program.
    cast_params: cast the weights that the layers use in the compute dtype (the projections'
      kernels and biases, the embeddings) once before the loop; False leaves the casts inside.
    top_k_method: how the k-th largest logit that top-k sampling keeps is found: 'sort'
      (lax.top_k, a sort of the vocabulary when k > 16 on XLA:GPU) or 'select' (kth_largest: a
      radix select over the bits of the logits, four counting passes and no sort).
    """

    layers: str = 'unrolled'
    positions_per_step: int = 1
    cast_params: bool = True
    top_k_method: str = 'sort'

    def __post_init__(self):
        if self.layers not in LAYERS:
            raise ValueError(f"decoding layers: expected one of {', '.join(LAYERS)}, found {self.layers!r}")
        if self.positions_per_step < 1:
            raise ValueError(f'positions_per_step: expected at least 1, found {self.positions_per_step}')
        if self.top_k_method not in TOP_K_METHODS:
            raise ValueError(
                f"top_k_method: expected one of {', '.join(TOP_K_METHODS)}, found {self.top_k_method!r}"
            )


def kth_largest(x_BxV, k: int):
    """The k-th largest value of each row, repeats counted: lax.top_k(x, k)[0][:, -1], in fp32.

    A radix select: floats map to uint32 keys of the same order, and the key is found 8 bits at a
    time from the top, as the largest prefix whose threshold still has k keys at or above it
    (each step one count of V x 256 comparisons, which XLA fuses into one reduction)."""
    bits_BxV = jax.lax.bitcast_convert_type(x_BxV.astype(jnp.float32), jnp.uint32)
    negative_BxV = (bits_BxV >> 31) == 1
    # Negatives: all bits flipped (larger magnitude, smaller key); the rest: the sign bit set.
    keys_BxV = jnp.where(negative_BxV, ~bits_BxV, bits_BxV | jnp.uint32(0x80000000))
    prefix_B = jnp.zeros(x_BxV.shape[:1], jnp.uint32)
    digits_256 = jnp.arange(256, dtype=jnp.uint32)
    for shift in (24, 16, 8, 0):
        thresholds_Bx256 = prefix_B[:, None] | (digits_256 << shift)[None]
        # V minor: 256 row reductions, which XLA:GPU runs one warp or block per row.
        counts_Bx256 = jnp.sum(keys_BxV[:, None, :] >= thresholds_Bx256[:, :, None], axis=2, dtype=jnp.int32)
        # Counts fall as the digit grows and digit 0 keeps the k of the prefix so far: the digits
        # that keep k are 0..d, and d is the next digit of the k-th largest key.
        digit_B = jnp.sum(counts_Bx256 >= k, axis=-1, dtype=jnp.int32) - 1
        prefix_B = prefix_B | (digit_B.astype(jnp.uint32) << shift)
    bits_B = jnp.where((prefix_B >> 31) == 1, prefix_B ^ jnp.uint32(0x80000000), ~prefix_B)
    return jax.lax.bitcast_convert_type(bits_B, jnp.float32)


def sample_next(logits_BxV, key, temperature, top_k: int, top_k_method: str = 'sort'):
    """A token per row: argmax when temperature <= 0; else softmax(logits / temperature) over the
    top_k largest logits (top_k <= 0: all), as train_gpt2.py's generate. top_k_method: how the
    k-th largest logit is found (DecodeOptions); both give the same tokens."""
    logits_BxV = logits_BxV.astype(jnp.float32)
    greedy_B = jnp.argmax(logits_BxV, axis=-1)
    if 0 < top_k < logits_BxV.shape[-1]:
        if top_k_method == 'select':
            kth_Bx1 = kth_largest(logits_BxV, top_k)[:, None]
        else:
            kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
        logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
    scaled_BxV = logits_BxV / jnp.maximum(temperature, 1e-6)
    sampled_B = jax.random.categorical(key, scaled_BxV, axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)


def _cached_attention(q_Bx1xNxH, k_BxKxSxH, v_BxKxSxH, pos):
    """Softmax attention of one query position over cache positions 0..pos, scaled by 1/sqrt(H).

    Query head n reads kv head n // G (LLaMA's repeat-interleave order, as attention.py). The
    cache's (B, K) lead and H is minor, so both products are batched matmuls over (B, K) that
    read the cache as it lies."""
    B, _, N, H = q_Bx1xNxH.shape
    K, S = k_BxKxSxH.shape[1], k_BxKxSxH.shape[2]
    q_BxKxGxH = q_Bx1xNxH.reshape(B, K, N // K, H)
    scores_BxKxGxS = jnp.einsum('bkgh,bksh->bkgs', q_BxKxGxH, k_BxKxSxH).astype(jnp.float32)
    scores_BxKxGxS = scores_BxKxGxS / math.sqrt(H)
    scores_BxKxGxS = jnp.where(jnp.arange(S) <= pos, scores_BxKxGxS, -jnp.inf)
    probs_BxKxGxS = jax.nn.softmax(scores_BxKxGxS, axis=-1).astype(v_BxKxSxH.dtype)
    y_BxKxGxH = jnp.einsum('bkgs,bksh->bkgh', probs_BxKxGxS, v_BxKxSxH)
    return y_BxKxGxH.reshape(B, 1, N * H)


def _store(cache_BxKxSxH, new_Bx1xKxH, pos):
    new_BxKx1xH = jnp.swapaxes(new_Bx1xKxH, 1, 2).astype(cache_BxKxSxH.dtype)
    return jax.lax.dynamic_update_slice(cache_BxKxSxH, new_BxKx1xH, (0, 0, pos, 0))


def _gpt2_block(block, x_Bx1xC, k_BxKxSxH, v_BxKxSxH, pos, rope):
    del rope  # GPT-2's positions were added to the embedding
    B, _, C = x_Bx1xC.shape
    N = block.attn.num_heads
    heads = lambda t: t.reshape(B, 1, N, C // N)  # noqa: E731
    q, k, v = jnp.split(block.attn.c_attn(block.ln_1(x_Bx1xC).astype(block.dtype)), 3, axis=-1)
    k_BxKxSxH, v_BxKxSxH = _store(k_BxKxSxH, heads(k), pos), _store(v_BxKxSxH, heads(v), pos)
    x_Bx1xC = x_Bx1xC + block.attn.c_proj(_cached_attention(heads(q), k_BxKxSxH, v_BxKxSxH, pos))
    x_Bx1xC = x_Bx1xC + block.mlp(block.ln_2(x_Bx1xC).astype(block.dtype))
    return x_Bx1xC, k_BxKxSxH, v_BxKxSxH


def _llama3_block(block, x_Bx1xC, k_BxKxSxH, v_BxKxSxH, pos, rope):
    cos_1xH2, sin_1xH2 = rope
    config = block.attn.config
    B, _, C = x_Bx1xC.shape
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = block.attn.c_attn(block.ln_1(x_Bx1xC).astype(block.dtype))
    q_Bx1xNxH = apply_rope(qkv[..., :C].reshape(B, 1, N, H), cos_1xH2, sin_1xH2)
    k_Bx1xKxH = apply_rope(qkv[..., C : C + K * H].reshape(B, 1, K, H), cos_1xH2, sin_1xH2)
    v_Bx1xKxH = qkv[..., C + K * H :].reshape(B, 1, K, H)
    k_BxKxSxH, v_BxKxSxH = _store(k_BxKxSxH, k_Bx1xKxH, pos), _store(v_BxKxSxH, v_Bx1xKxH, pos)
    x_Bx1xC = x_Bx1xC + block.attn.c_proj(_cached_attention(q_Bx1xNxH, k_BxKxSxH, v_BxKxSxH, pos))
    x_Bx1xC = x_Bx1xC + block.mlp(block.ln_2(x_Bx1xC).astype(block.dtype))
    return x_Bx1xC, k_BxKxSxH, v_BxKxSxH


def _rope_tables(config, length: int):
    """cos and sin (S, H/2) exactly as LLaMA3.features builds them (float64 angles, then fp32)."""
    freqs_H2 = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    angles_SxH2 = np.arange(length, dtype=np.float64)[:, None] * freqs_H2[None, :]
    return np.cos(angles_SxH2).astype(np.float32), np.sin(angles_SxH2).astype(np.float32)


def cast_to_compute_dtype(model: nnx.Module) -> None:
    """Casts, in place, the weight matrices that the model's projections and embeddings use in
    their compute dtype (nnx.Linear's kernel, a LoRA adapter's matrices, nnx.Embed's table), which
    those layers would cast at every call anyway: their outputs are unchanged. Biases and norm
    scales stay as they are: they are small, and some are read in fp32 (the norms, and the bias
    that a fused bias + GELU kernel adds)."""
    for _, module in nnx.iter_modules(model):
        dtype = getattr(module, 'dtype', None)
        if not isinstance(module, (nnx.Linear, nnx.Embed)) or dtype is None:
            continue
        for name, variable in list(vars(module).items()):
            if isinstance(variable, nnx.Variable) and name != 'bias':
                setattr(module, name, type(variable)(variable[...].astype(dtype)))


class Decoder:
    """Generates `length` positions for `batch_size` rows; compiled on first use, then reused.
    out_sharding: a replicated sharding on the params' mesh (the trainer passes its own): the prompt,
    key and temperature are placed there and the tokens come out there; None: jit's choice.
    options: how the loop is compiled (DecodeOptions); the tokens do not depend on it (but see
      cast_params in bfloat16).

    decoder(params, prompt_ids, key, temperature) -> (B, length) int32 tokens, the prompt first.
    `trace_count` counts how often the loop body was traced (1 after any number of calls).
    """

    def __init__(
        self,
        graphdef,
        model_config,
        *,
        batch_size: int,
        length: int,
        top_k: int = DEFAULT_TOP_K,
        out_sharding=None,
        options: DecodeOptions = DecodeOptions(),
    ):
        if not 2 <= length <= model_config.max_seq_len:
            raise ValueError(
                f'decoding length: expected 2..{model_config.max_seq_len} (max_seq_len), found {length}'
            )
        if batch_size < 1:
            raise ValueError(f'decoding batch size: expected at least 1, found {batch_size}')
        self.graphdef, self.config, self.options = graphdef, model_config, options
        self.batch_size, self.length, self.top_k = batch_size, length, top_k
        self.trace_count = 0
        self.compile_seconds = 0.0
        # Under a mesh of several processes the tokens come out replicated, so each one reads them whole.
        self.out_sharding = out_sharding
        self._run = jax.jit(self._generate, out_shardings=out_sharding)
        self._compiled = None

    def _generate(self, params, tokens_BxS, prompt_len, key_data, temperature):
        self.trace_count += 1
        key = jax.random.wrap_key_data(key_data)
        model = nnx.merge(self.graphdef, nnx.State(params))  # params: the pure dict the trainer holds
        gpt2 = isinstance(model, GPT2)
        if not gpt2 and not isinstance(model, LLaMA3):
            raise TypeError(f'decoding: expected a GPT2 or LLaMA3 model, found {type(model).__name__}')
        options, cfg = self.options, self.config
        if options.cast_params:
            cast_to_compute_dtype(model)
        B, S = tokens_BxS.shape
        L, N, K = cfg.num_layers, cfg.num_heads, (cfg.num_heads if gpt2 else cfg.num_kv_heads)
        H = cfg.channels // N
        block_def, block_state = nnx.split(model.h)
        block_step = _gpt2_block if gpt2 else _llama3_block
        cos_SxH2, sin_SxH2 = (None, None) if gpt2 else (jnp.asarray(t) for t in _rope_tables(cfg, S))
        embedding_VxC = model.wte.embedding[...]
        positions_SxC = None if not gpt2 else model.wpe.embedding[...]
        unrolled = options.layers == 'unrolled'
        if unrolled:
            # Slices taken once, outside the loop: each layer's params are arrays of their own.
            layer_states = [jax.tree.map(lambda p, i=i: p[i], block_state) for i in range(L)]
            caches = tuple(jnp.zeros((B, K, S, H), model.dtype) for _ in range(2 * L))  # k, v per layer
        else:
            caches = (jnp.zeros((L, B, K, S, H), model.dtype),) * 2

        def blocks(pos, x_Bx1xC, caches, rope):
            if unrolled:
                out = []
                for i in range(L):
                    block = nnx.merge(block_def, layer_states[i])
                    x_Bx1xC, k_BxKxSxH, v_BxKxSxH = block_step(
                        block, x_Bx1xC, caches[2 * i], caches[2 * i + 1], pos, rope
                    )
                    out += [k_BxKxSxH, v_BxKxSxH]
                return x_Bx1xC, tuple(out)

            def layer(x_Bx1xC, per_layer):
                state, k_BxKxSxH, v_BxKxSxH = per_layer
                block = nnx.merge(block_def, state)
                x_Bx1xC, k_BxKxSxH, v_BxKxSxH = block_step(block, x_Bx1xC, k_BxKxSxH, v_BxKxSxH, pos, rope)
                return x_Bx1xC, (k_BxKxSxH, v_BxKxSxH)

            x_Bx1xC, caches = jax.lax.scan(layer, x_Bx1xC, (block_state, *caches))
            return x_Bx1xC, caches

        def logits_at(pos, tokens_B, caches):
            x_Bx1xC = jnp.take(embedding_VxC, tokens_B, axis=0).astype(model.dtype)[:, None]
            if gpt2:
                x_Bx1xC = x_Bx1xC + positions_SxC[pos].astype(model.dtype)
                rope = None
            else:
                rope = tuple(jax.lax.dynamic_slice_in_dim(t, pos, 1) for t in (cos_SxH2, sin_SxH2))
            x_Bx1xC, caches = blocks(pos, x_Bx1xC, caches, rope)
            h_Bx1xC = model.ln_f(x_Bx1xC).astype(model.dtype)
            logits_Bx1xV = model.wte.attend(h_Bx1xC) if gpt2 else model.head(h_Bx1xC)
            # GPT-2's padded columns V..Vp-1 are never sampled (the loss ignores them too).
            return logits_Bx1xV[:, 0, : cfg.vocab_size], caches

        def position(t, carry):
            tokens_BxS, caches = carry
            logits_BxV, caches = logits_at(t, tokens_BxS[:, t], caches)
            sampled_B = sample_next(
                logits_BxV, jax.random.fold_in(key, t), temperature, self.top_k, options.top_k_method
            )
            given_B = tokens_BxS[:, t + 1]
            next_B = jnp.where(t + 1 < prompt_len, given_B, sampled_B)
            return jax.lax.dynamic_update_slice(tokens_BxS, next_B[:, None], (0, t + 1)), caches

        tokens_BxS, _ = jax.lax.fori_loop(
            0, S - 1, position, (tokens_BxS, caches), unroll=options.positions_per_step
        )
        return tokens_BxS

    def prompt_buffer(self, prompt_ids) -> np.ndarray:
        prompt = np.asarray(prompt_ids, np.int64).reshape(-1)
        if not 1 <= len(prompt) < self.length:
            raise ValueError(
                f'prompt: expected 1..{self.length - 1} tokens (fewer than the decoding length), '
                f'found {len(prompt)}'
            )
        if prompt.min() < 0 or prompt.max() >= self.config.vocab_size:
            raise ValueError(
                f'prompt: token ids: expected 0..{self.config.vocab_size - 1}, found '
                f'{int(prompt.min() if prompt.min() < 0 else prompt.max())}'
            )
        tokens_BxS = np.zeros((self.batch_size, self.length), np.int32)
        tokens_BxS[:, : len(prompt)] = prompt
        return tokens_BxS

    def _executable(self, args):
        """The one compiled program (AOT: lowered and compiled on first use, then kept)."""
        if self._compiled is None:
            began = time.perf_counter()
            self._compiled = self._run.lower(*args).compile()
            self.compile_seconds = time.perf_counter() - began
        return self._compiled

    def timed(self, params, prompt_ids, key, temperature: float = DEFAULT_TEMPERATURE):
        """(B, length) tokens, the prompt first and then sampled tokens (every row its own), and
        the seconds the decoding took, compilation excluded (that is `compile_seconds`)."""
        tokens_BxS = self.prompt_buffer(prompt_ids)
        prompt_len = np.int32(len(np.asarray(prompt_ids).reshape(-1)))
        host_args = (tokens_BxS, prompt_len, np.asarray(jax.random.key_data(key)), np.float32(temperature))
        if self.out_sharding is not None:
            # Onto the params' mesh, replicated; with several processes each supplies its own devices.
            host_args = put_global(host_args, self.out_sharding)
        args = (params, *host_args)
        executable = self._executable(args)
        began = time.perf_counter()
        out = jax.block_until_ready(executable(*args))
        seconds = time.perf_counter() - began
        host = out if out.is_fully_addressable else out.addressable_shards[0].data
        return np.asarray(jax.device_get(host)), seconds

    def __call__(self, params, prompt_ids, key, temperature: float = DEFAULT_TEMPERATURE) -> np.ndarray:
        return self.timed(params, prompt_ids, key, temperature)[0]
