"""The Flax models against the independent NumPy reference (tests/numpy_reference.py)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from tiny_models import tiny_config

from jaxtrain.models.gpt2 import GPT2, GPT2Config
from jaxtrain.models.llama3 import LLaMA3, LLaMA3Config, apply_rope, rope_frequencies

GPT2_SMALL = tiny_config('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16)
LLAMA_SMALL = tiny_config(
    'llama3', max_seq_len=16, vocab_size=48, channels=16, ffn_dim_multiplier=1.3, multiple_of=8
)


# Every forward pass here is one jitted program per model (_forward) on tokens of this one shape,
# so that each model compiles once for the file: a new shape compiles it again.
TOKENS_SHAPE = (2, 16)
assert GPT2_SMALL.max_seq_len == LLAMA_SMALL.max_seq_len == TOKENS_SHAPE[1]


def _randomize(params, seed):
    """Random values everywhere (biases and norm scales too) so no term can hide."""
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(treedef, [rng.normal(0, 0.3, np.shape(x)).astype(np.float32) for x in leaves])


def _model_and_params(cls, config, seed=0):
    # The shapes alone: every value is replaced, and an eager init runs op by op (seconds on CPU).
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))), nnx.Param)
    params = _randomize(nnx.to_pure_dict(abstract), seed)
    return graphdef, params


def _unrolled_graphdef(cls, config):
    return nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), scan_layers=False)), nnx.Param)[0]


@functools.cache
def _forward(graphdef):
    """One jitted forward pass per model (graphdef): eagerly, every op dispatches and compiles on its own."""
    return jax.jit(lambda params, tokens: nnx.merge(graphdef, nnx.State(params))(tokens))


def _logits(graphdef, params, tokens):
    return np.asarray(_forward(graphdef)(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens)))


def test_gpt2_logits_match_numpy_reference():
    graphdef, params = _model_and_params(GPT2, GPT2_SMALL)
    tokens = np.random.default_rng(1).integers(0, GPT2_SMALL.vocab_size, TOKENS_SHAPE)
    expected = ref.gpt2_logits(params, GPT2_SMALL.num_heads, tokens)
    np.testing.assert_allclose(_logits(graphdef, params, tokens), expected, atol=1e-5, rtol=1e-5)


def test_gpt2_head_is_tied_to_wte():
    graphdef, params = _model_and_params(GPT2, GPT2_SMALL)
    assert 'lm_head' not in params and set(params) == {'wte', 'wpe', 'h', 'ln_f'}
    tokens = np.zeros(TOKENS_SHAPE, np.int64)
    bumped = jax.tree.map(np.copy, params)
    bumped['wte']['embedding'][7] += 1.0  # an unused token's row still changes its logit
    diff = _logits(graphdef, bumped, tokens) - _logits(graphdef, params, tokens)
    assert np.abs(diff[..., 7]).max() > 1e-3
    assert np.abs(np.delete(diff, 7, axis=-1)).max() < 1e-6


def test_gpt2_random_init_padding_rows_are_zero():
    # Jitted: an eager init runs op by op (seconds on CPU); the random draws are the same.
    init = jax.jit(lambda: nnx.to_pure_dict(nnx.split(GPT2(GPT2_SMALL, rngs=nnx.Rngs(3)), nnx.Param)[1]))
    wte = np.asarray(init()['wte']['embedding'])
    assert wte.shape == (64, 16)
    assert not wte[GPT2_SMALL.vocab_size :].any() and wte[: GPT2_SMALL.vocab_size].std() > 0.01


def test_gpt2_parameter_count_matches_llmc_formula():
    _, state = nnx.split(nnx.eval_shape(lambda: GPT2(GPT2Config(), rngs=nnx.Rngs(0))), nnx.Param)
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.to_pure_dict(state)))
    assert count == GPT2Config().num_parameters == 124_475_904  # docs/formats.md §1


@pytest.mark.parametrize('use_scaled_rope', [False, True])
def test_llama3_logits_match_numpy_reference(use_scaled_rope):
    config = dataclasses.replace(LLAMA_SMALL, use_scaled_rope=use_scaled_rope, rope_theta=500000.0)
    graphdef, params = _model_and_params(LLaMA3, config)
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, TOKENS_SHAPE)
    expected = ref.llama3_logits(
        params,
        config.num_heads,
        config.num_kv_heads,
        tokens,
        rope_theta=config.rope_theta,
        norm_eps=config.norm_eps,
        use_scaled_rope=use_scaled_rope,
    )
    np.testing.assert_allclose(_logits(graphdef, params, tokens), expected, atol=1e-5, rtol=1e-5)


def test_llama3_shapes_and_untied_head():
    _, params = _model_and_params(LLaMA3, LLAMA_SMALL)
    F = LLAMA_SMALL.ffn_hidden_dim
    assert F == 56  # 4C=64 -> 2/3 -> 42 -> x1.3 -> 54 -> rounded up to a multiple of 8 -> 56
    assert params['lm_head']['kernel'].shape == (16, 48)
    assert params['h']['attn']['c_attn']['kernel'].shape == (2, 16, 16 + 2 * 2 * 4)
    assert params['h']['mlp']['c_fc2']['kernel'].shape == (2, 16, F)


def test_llama_ffn_hidden_of_released_configs():
    # docs/formats.md §2c: 1B -> 8192, 3B -> 8192, 8B -> 14336.
    assert LLaMA3Config().ffn_hidden_dim == 8192
    assert LLaMA3Config(channels=3072, num_heads=24, ffn_dim_multiplier=1.0).ffn_hidden_dim == 8192
    assert LLaMA3Config(channels=4096, ffn_dim_multiplier=1.3).ffn_hidden_dim == 14336
    assert LLaMA3Config().num_parameters == 1_498_482_688  # as stored, with a separate lm_head


def test_rope_hand_computed():
    # head dim 4, theta 100: freqs 1 and 0.1; position 1 rotates pair 0 by 1 rad, pair 1 by 0.1 rad.
    np.testing.assert_allclose(rope_frequencies(4, 100.0, None), [1.0, 0.1])
    x = jnp.array([1.0, 0.0, 0.0, 2.0]).reshape(1, 1, 1, 4)
    angles = np.array([[1.0, 0.1]])
    out = np.asarray(
        apply_rope(
            jnp.concatenate([x, x], axis=1), np.cos(np.r_[[[0, 0]], angles]), np.sin(np.r_[[[0, 0]], angles])
        )
    )
    np.testing.assert_allclose(out[0, 0, 0], [1, 0, 0, 2], atol=1e-7)
    np.testing.assert_allclose(
        out[0, 1, 0], [np.cos(1), np.sin(1), -2 * np.sin(0.1), 2 * np.cos(0.1)], atol=1e-6
    )


def test_rope_scaling_keeps_high_and_divides_low_frequencies():
    freqs = rope_frequencies(64, 500000.0, None)
    scaled = rope_frequencies(64, 500000.0, (8.0, 1.0, 4.0, 8192))
    wavelen = 2 * np.pi / freqs
    np.testing.assert_allclose(scaled[wavelen < 2048], freqs[wavelen < 2048])
    np.testing.assert_allclose(scaled[wavelen > 8192], freqs[wavelen > 8192] / 8)


def test_gqa_query_heads_share_kv_heads_in_order():
    # 4 query heads, 2 kv heads: heads 0,1 read kv head 0 and heads 2,3 read kv head 1.
    from jaxtrain.models.attention import causal_attention

    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 5, 4, 8)).astype(np.float32)
    k = rng.normal(size=(1, 5, 2, 8)).astype(np.float32)
    v = rng.normal(size=(1, 5, 2, 8)).astype(np.float32)
    attend = jax.jit(causal_attention, static_argnums=3)  # eagerly, op by op, costs 3 times the compiles
    out = np.asarray(attend(q, k, v, 'xla'))
    repeated = np.asarray(attend(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2), 'xla'))
    np.testing.assert_allclose(out, repeated, atol=1e-6)
    single = np.asarray(attend(q[:, :, 3:4], k[:, :, 1:2], v[:, :, 1:2], 'xla'))
    np.testing.assert_allclose(out[:, :, 3:4], single, atol=1e-6)


@pytest.mark.parametrize('cls,config', [(GPT2, GPT2_SMALL), (LLaMA3, LLAMA_SMALL)])
def test_causality_future_tokens_do_not_change_past_logits(cls, config):
    graphdef, params = _model_and_params(cls, config)
    tokens = np.random.default_rng(4).integers(0, config.vocab_size, TOKENS_SHAPE)
    changed = tokens.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % config.vocab_size
    a, b = _logits(graphdef, params, tokens), _logits(graphdef, params, changed)
    np.testing.assert_array_equal(a[:, :6], b[:, :6])
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-4


@pytest.mark.parametrize('cls,config', [(GPT2, GPT2_SMALL), (LLaMA3, LLAMA_SMALL)])
def test_unrolled_layers_give_the_same_logits(cls, config):
    graphdef, params = _model_and_params(cls, config)
    tokens = np.random.default_rng(6).integers(0, config.vocab_size, TOKENS_SHAPE)
    expected = _logits(graphdef, params, tokens)
    unrolled_def = _unrolled_graphdef(cls, config)
    np.testing.assert_allclose(_logits(unrolled_def, params, tokens), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.xla_optimized  # bitwise equality of two programs, as a user's run compiles them
@pytest.mark.parametrize('cls,config', [(GPT2, GPT2_SMALL), (LLaMA3, LLAMA_SMALL)])
def test_unrolled_gradients_equal_those_of_indexing_each_layer_bitwise(cls, config, monkeypatch):
    # layer_stack.apply_blocks splits each stacked tensor once; taking p[layer] per layer (the
    # reference here) gives zero-padded gradients that are summed. Adding zeros is exact.
    from jaxtrain.models import layer_stack

    # XLA attention: no scaling; no recompute regions
    def indexed(stacked_blocks, x, *extra, scan=True, distinct_attention=False, recompute=None):
        block_def, block_params = nnx.split(stacked_blocks)
        for layer in range(jax.tree.leaves(block_params)[0].shape[0]):
            x = nnx.merge(block_def, jax.tree.map(lambda p: p[layer], block_params))(x, *extra)
        return x

    graphdef, params = _model_and_params(cls, config)
    unrolled_def = _unrolled_graphdef(cls, config)
    tokens = jnp.asarray(np.random.default_rng(7).integers(0, config.vocab_size, (2, 9)))

    def grads():  # jitted, as a user's run: eagerly, every op compiled with XLA's optimizations costs seconds
        loss = lambda p: jnp.sum(nnx.merge(unrolled_def, nnx.State(p))(tokens) ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss))(jax.tree.map(jnp.asarray, params))

    split = grads()
    monkeypatch.setattr(layer_stack, 'apply_blocks', indexed)
    for module in ('gpt2', 'llama3'):
        monkeypatch.setattr(f'jaxtrain.models.{module}.apply_blocks', indexed)
    for got, want in zip(jax.tree.leaves(split), jax.tree.leaves(grads())):
        np.testing.assert_array_equal(got, want)
