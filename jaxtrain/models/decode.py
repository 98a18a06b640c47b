"""Autoregressive decoding with a KV cache, for GPT-2 and LLaMA-3, compiled once.

Axis letters: B batch (samples), S positions (the fixed decoding length), C channels, N query
heads, K key/value heads, G = N/K query heads per kv head, H head dim, L layers, V vocab.

One jitted function runs the whole sequence: a `lax.fori_loop` over positions 0..S-2 feeds one
token per step through the stacked blocks (`lax.scan` over L, as the trainer's scanned model),
appends that position's keys and values to a cache of fixed shape (L, B, S, K, H), and attends
over the positions filled so far. Prompt tokens are fed the same way (teacher-forced: the
sampled token is discarded while the prompt lasts), so the prompt length is a traced value, not
a shape, and new prompts, seeds and temperatures reuse the one compilation. Only the batch
size, S and top_k (lax.top_k needs a static k) are part of the compiled shape.

The blocks are the models' own submodules (ln_1, c_attn, c_proj, mlp, ...), called here one
position at a time, so the models need no decoding code and any change to those layers (a
LoRA adapter on a projection) applies to decoding too. What is re-done here is only what
depends on the cache: attention over cached positions and the position embedding or RoPE
angle of one position. Works under the trainer's mesh: jit keeps the params' shardings.
"""

from __future__ import annotations

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


def sample_next(logits_BxV, key, temperature, top_k: int):
    """A token per row: argmax when temperature <= 0; else softmax(logits / temperature) over the
    top_k largest logits (top_k <= 0: all), as train_gpt2.py's generate."""
    logits_BxV = logits_BxV.astype(jnp.float32)
    greedy_B = jnp.argmax(logits_BxV, axis=-1)
    if 0 < top_k < logits_BxV.shape[-1]:
        kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
        logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
    scaled_BxV = logits_BxV / jnp.maximum(temperature, 1e-6)
    sampled_B = jax.random.categorical(key, scaled_BxV, axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)


def _cached_attention(q_Bx1xNxH, k_BxSxKxH, v_BxSxKxH, pos):
    """Softmax attention of one query position over cache positions 0..pos, scaled by 1/sqrt(H).

    Query head n reads kv head n // G (LLaMA's repeat-interleave order, as attention.py)."""
    B, _, N, H = q_Bx1xNxH.shape
    S, K = k_BxSxKxH.shape[1], k_BxSxKxH.shape[2]
    q_BxKxGxH = q_Bx1xNxH.reshape(B, K, N // K, H)
    scores_BxKxGxS = jnp.einsum('bkgh,bskh->bkgs', q_BxKxGxH, k_BxSxKxH).astype(jnp.float32)
    scores_BxKxGxS = scores_BxKxGxS / math.sqrt(H)
    scores_BxKxGxS = jnp.where(jnp.arange(S) <= pos, scores_BxKxGxS, -jnp.inf)
    probs_BxKxGxS = jax.nn.softmax(scores_BxKxGxS, axis=-1).astype(v_BxSxKxH.dtype)
    y_BxKxGxH = jnp.einsum('bkgs,bskh->bkgh', probs_BxKxGxS, v_BxSxKxH)
    return y_BxKxGxH.reshape(B, 1, N * H)


def _store(cache_BxSxKxH, new_Bx1xKxH, pos):
    return jax.lax.dynamic_update_slice(
        cache_BxSxKxH, new_Bx1xKxH.astype(cache_BxSxKxH.dtype), (0, pos, 0, 0)
    )


def _gpt2_block(block, x_Bx1xC, k_BxSxNxH, v_BxSxNxH, pos, rope):
    del rope  # GPT-2's positions were added to the embedding
    B, _, C = x_Bx1xC.shape
    N = block.attn.num_heads
    heads = lambda t: t.reshape(B, 1, N, C // N)  # noqa: E731
    q, k, v = jnp.split(block.attn.c_attn(block.ln_1(x_Bx1xC).astype(block.dtype)), 3, axis=-1)
    k_BxSxNxH, v_BxSxNxH = _store(k_BxSxNxH, heads(k), pos), _store(v_BxSxNxH, heads(v), pos)
    x_Bx1xC = x_Bx1xC + block.attn.c_proj(_cached_attention(heads(q), k_BxSxNxH, v_BxSxNxH, pos))
    x_Bx1xC = x_Bx1xC + block.mlp(block.ln_2(x_Bx1xC).astype(block.dtype))
    return x_Bx1xC, k_BxSxNxH, v_BxSxNxH


def _llama3_block(block, x_Bx1xC, k_BxSxKxH, v_BxSxKxH, pos, rope):
    cos_1xH2, sin_1xH2 = rope
    config = block.attn.config
    B, _, C = x_Bx1xC.shape
    N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = block.attn.c_attn(block.ln_1(x_Bx1xC).astype(block.dtype))
    q_Bx1xNxH = apply_rope(qkv[..., :C].reshape(B, 1, N, H), cos_1xH2, sin_1xH2)
    k_Bx1xKxH = apply_rope(qkv[..., C : C + K * H].reshape(B, 1, K, H), cos_1xH2, sin_1xH2)
    v_Bx1xKxH = qkv[..., C + K * H :].reshape(B, 1, K, H)
    k_BxSxKxH, v_BxSxKxH = _store(k_BxSxKxH, k_Bx1xKxH, pos), _store(v_BxSxKxH, v_Bx1xKxH, pos)
    x_Bx1xC = x_Bx1xC + block.attn.c_proj(_cached_attention(q_Bx1xNxH, k_BxSxKxH, v_BxSxKxH, pos))
    x_Bx1xC = x_Bx1xC + block.mlp(block.ln_2(x_Bx1xC).astype(block.dtype))
    return x_Bx1xC, k_BxSxKxH, v_BxSxKxH


def _rope_tables(config, length: int):
    """cos and sin (S, H/2) exactly as LLaMA3.features builds them (float64 angles, then fp32)."""
    freqs_H2 = rope_frequencies(config.head_dim, config.rope_theta, config.use_scaled_rope)
    angles_SxH2 = np.arange(length, dtype=np.float64)[:, None] * freqs_H2[None, :]
    return np.cos(angles_SxH2).astype(np.float32), np.sin(angles_SxH2).astype(np.float32)


class Decoder:
    """Generates `length` positions for `batch_size` rows; compiled on first use, then reused.
    out_sharding: a replicated sharding on the params' mesh (the trainer passes its own): the prompt,
    key and temperature are placed there and the tokens come out there; None: jit's choice.

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
    ):
        if not 2 <= length <= model_config.max_seq_len:
            raise ValueError(
                f'decoding length: expected 2..{model_config.max_seq_len} (max_seq_len), found {length}'
            )
        if batch_size < 1:
            raise ValueError(f'decoding batch size: expected at least 1, found {batch_size}')
        self.graphdef, self.config = graphdef, model_config
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
        cfg = self.config
        B, S = tokens_BxS.shape
        N, K = cfg.num_heads, (cfg.num_heads if gpt2 else cfg.num_kv_heads)
        cache_LxBxSxKxH = jnp.zeros((cfg.num_layers, B, S, K, cfg.channels // N), model.dtype)
        block_def, block_state = nnx.split(model.h)
        block_step = _gpt2_block if gpt2 else _llama3_block
        cos_SxH2, sin_SxH2 = (None, None) if gpt2 else (jnp.asarray(t) for t in _rope_tables(cfg, S))
        embedding_VxC = model.wte.embedding[...]

        def logits_at(pos, tokens_B, k_cache, v_cache):
            x_Bx1xC = jnp.take(embedding_VxC, tokens_B, axis=0).astype(model.dtype)[:, None]
            if gpt2:
                x_Bx1xC = x_Bx1xC + model.wpe.embedding[...][pos].astype(model.dtype)
                rope = None
            else:
                rope = tuple(jax.lax.dynamic_slice_in_dim(t, pos, 1) for t in (cos_SxH2, sin_SxH2))

            def layer(x_Bx1xC, per_layer):
                state, k_BxSxKxH, v_BxSxKxH = per_layer
                block = nnx.merge(block_def, state)
                x_Bx1xC, k_BxSxKxH, v_BxSxKxH = block_step(block, x_Bx1xC, k_BxSxKxH, v_BxSxKxH, pos, rope)
                return x_Bx1xC, (k_BxSxKxH, v_BxSxKxH)

            x_Bx1xC, (k_cache, v_cache) = jax.lax.scan(layer, x_Bx1xC, (block_state, k_cache, v_cache))
            h_Bx1xC = model.ln_f(x_Bx1xC).astype(model.dtype)
            logits_Bx1xV = model.wte.attend(h_Bx1xC) if gpt2 else model.lm_head(h_Bx1xC)
            # GPT-2's padded columns V..Vp-1 are never sampled (the loss ignores them too).
            return logits_Bx1xV[:, 0, : cfg.vocab_size], k_cache, v_cache

        def position(t, carry):
            tokens_BxS, k_cache, v_cache = carry
            logits_BxV, k_cache, v_cache = logits_at(t, tokens_BxS[:, t], k_cache, v_cache)
            sampled_B = sample_next(logits_BxV, jax.random.fold_in(key, t), temperature, self.top_k)
            given_B = tokens_BxS[:, t + 1]
            next_B = jnp.where(t + 1 < prompt_len, given_B, sampled_B)
            return jax.lax.dynamic_update_slice(tokens_BxS, next_B[:, None], (0, t + 1)), k_cache, v_cache

        tokens_BxS, _, _ = jax.lax.fori_loop(
            0, S - 1, position, (tokens_BxS, cache_LxBxSxKxH, cache_LxBxSxKxH)
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
