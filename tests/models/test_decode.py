"""KV-cache decoding against full forward passes of the same models (whose logits
tests/models/test_models.py pins to the NumPy reference), for both families."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain.models.decode import DecodeOptions, Decoder, kth_largest, sample_next
from jaxtrain.models.gpt2 import GPT2
from jaxtrain.models.llama3 import LLaMA3
from test_models import GPT2_SMALL, LLAMA_SMALL, _forward, _logits, _model_and_params

FAMILIES = [(GPT2, GPT2_SMALL), (LLaMA3, LLAMA_SMALL)]
# One length (the models' whole context) and few (batch size, top_k) pairs across the tests: each new
# combination is a decoder and a full forward pass to compile, most of this file's time.
LENGTH = GPT2_SMALL.max_seq_len
assert LLAMA_SMALL.max_seq_len == LENGTH


def _full_forward_greedy(graphdef, params, config, prompt, length):
    """Argmax of a full forward pass over the prefix, one new token at a time. The input is padded to
    `length` so that one compilation serves every prefix: the model is causal, so the logits at t
    do not see the padding after it."""
    forward = _forward(graphdef)  # one jitted forward pass per model, shared by the tests
    params = jax.tree.map(jnp.asarray, params)
    tokens = np.zeros((1, length), np.int32)
    tokens[0, : len(prompt)] = prompt
    for t in range(len(prompt), length):
        logits = np.asarray(forward(params, tokens))[0, t - 1, : config.vocab_size]
        tokens[0, t] = int(np.argmax(logits))
    return tokens[0].tolist()


@functools.cache
def _decoder(cls, config, batch_size, top_k):
    """One Decoder per model and setting, shared by the tests that decode with it: a new instance
    traces and lowers its loop again (the params' values are arguments, not part of the program)."""
    graphdef = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))), nnx.Param)[0]
    return Decoder(graphdef, config, batch_size=batch_size, length=LENGTH, top_k=top_k)


@pytest.mark.parametrize('cls, config', FAMILIES, ids=['gpt2', 'llama3'])
def test_greedy_equals_full_forward_argmax_and_compiles_once(cls, config):
    graphdef, params = _model_and_params(cls, config, seed=3)
    decoder = _decoder(cls, config, 2, 0)
    for prompt in ([1], [5, 7, 2]):
        got = decoder(params, prompt, jax.random.key(0), temperature=0.0)
        expected = _full_forward_greedy(graphdef, params, config, prompt, LENGTH)
        assert got.shape == (2, LENGTH)
        assert got[0].tolist() == expected and got[1].tolist() == expected
    # Another prompt length, seed and temperature reuse the first trace: nothing per token or per call.
    decoder(params, [3, 3, 3, 3], jax.random.key(9), temperature=0.7)
    assert decoder.trace_count == 1  # the tests that share this decoder did not trace it again


@pytest.mark.slow
@pytest.mark.parametrize('cls, config', FAMILIES, ids=['gpt2', 'llama3'])
def test_top_k_samples_stay_in_the_full_forward_top_k(cls, config):
    graphdef, params = _model_and_params(cls, config, seed=4)
    k = 5  # the sampling decoder of the variants' test below: one compile for both
    decoder = _decoder(cls, config, 3, k)
    prompt = [2, 9]
    tokens = decoder(params, prompt, jax.random.key(1), temperature=1.0)
    assert (tokens[:, :2] == prompt).all()
    logits = _logits(graphdef, params, tokens)[..., : config.vocab_size]  # teacher-forced on the samples
    for t in range(len(prompt), LENGTH):
        top = np.argsort(logits[:, t - 1], axis=-1)[:, -k:]
        assert all(tokens[b, t] in top[b] for b in range(3))
    # Rows differ (each its own draw), and a seed repeats exactly.
    assert len({tuple(row) for row in tokens.tolist()}) > 1
    np.testing.assert_array_equal(tokens, decoder(params, prompt, jax.random.key(1), temperature=1.0))


def test_sample_next_matches_the_softmax_of_the_top_k():
    """Frequencies of 20k draws against softmax(top-k logits / temperature) computed in NumPy."""
    logits = np.array([[2.0, 1.0, 0.5, -1.0, 3.0]], np.float32)
    # Jitted: eagerly, each batched op dispatches and compiles on its own.
    draws = jax.jit(jax.vmap(lambda key: sample_next(jnp.asarray(logits), key, 0.8, 3)))(
        jax.random.split(jax.random.key(0), 20000)
    )
    counts = np.bincount(np.asarray(draws).reshape(-1), minlength=5) / 20000
    kept = np.array([1, 1, 0, 0, 1], bool)
    expected = np.where(kept, np.exp(logits[0] / 0.8), 0.0)
    np.testing.assert_allclose(counts, expected / expected.sum(), atol=0.015)
    assert int(sample_next(jnp.asarray(logits), jax.random.key(0), 0.0, 0)[0]) == 4


# Each lever of the loop on its own, and all of them together against the default.
VARIANTS = {
    'scan': DecodeOptions(layers='scan', cast_params=False),
    'three_positions_per_step': DecodeOptions(positions_per_step=3),
    'select': DecodeOptions(top_k_method='select'),
    'scan_select_two': DecodeOptions(layers='scan', positions_per_step=2, top_k_method='select'),
}


@pytest.mark.parametrize('cls, config', FAMILIES, ids=['gpt2', 'llama3'])
@pytest.mark.parametrize(
    'variant',
    [
        # scan and select alone: every assertion is scan_select_two's (scan layers, the select
        # top-k, which does not depend on the layers), and cast_params=False changes nothing in
        # fp32 (test_bf16_weights_cast_before_the_loop_give_the_same_tokens holds it in bf16).
        name if name not in ('scan', 'select') else pytest.param(name, marks=pytest.mark.heavy)
        for name in VARIANTS
    ],
)
def test_every_variant_decodes_greedy_as_the_full_forward_and_samples_as_the_default(cls, config, variant):
    """Greedy tokens equal the full forward pass's argmax in every row; sampled tokens (top-k, rows
    differing) equal the default decoder's for the same key, so no variant changes the tokens."""
    graphdef, params = _model_and_params(cls, config, seed=6)
    length, prompt = LENGTH, [4, 1, 6]
    decoder = Decoder(graphdef, config, batch_size=3, length=length, top_k=5, options=VARIANTS[variant])
    expected = _full_forward_greedy(graphdef, params, config, prompt, length)
    assert decoder(params, prompt, jax.random.key(0), temperature=0.0).tolist() == [expected] * 3
    default = _decoder(cls, config, 3, 5)  # the top-k test's: compiled once for both
    sampled = default(params, prompt, jax.random.key(2), temperature=1.0)
    assert len({tuple(row) for row in sampled.tolist()}) > 1
    np.testing.assert_array_equal(decoder(params, prompt, jax.random.key(2), temperature=1.0), sampled)


@pytest.mark.parametrize('cls, config', FAMILIES, ids=['gpt2', 'llama3'])
def test_one_row_decodes_greedy_as_the_full_forward(cls, config):
    graphdef, params = _model_and_params(cls, config, seed=8)
    decoder = _decoder(cls, config, 1, 0)
    for prompt in ([2], [7, 3, 3, 1]):
        expected = _full_forward_greedy(graphdef, params, config, prompt, LENGTH)
        assert decoder(params, prompt, jax.random.key(0), temperature=0.0).tolist() == [expected]


@pytest.mark.slow
@pytest.mark.parametrize('cls, config', FAMILIES, ids=['gpt2', 'llama3'])
def test_bf16_weights_cast_before_the_loop_give_the_same_tokens(cls, config):
    """In bf16 the projections and embeddings cast their fp32 params at every call; casting them once
    before the loop leaves every logit as it was: the sampled tokens are equal."""
    _, params = _model_and_params(cls, config, seed=7)
    graphdef = nnx.split(
        nnx.eval_shape(lambda: cls(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))), nnx.Param
    )[0]
    cast, left = (
        Decoder(graphdef, config, batch_size=2, length=8, top_k=0, options=DecodeOptions(cast_params=c))(
            params, [3], jax.random.key(5), temperature=1.0
        )
        for c in (True, False)
    )
    np.testing.assert_array_equal(cast, left)


def test_kth_largest_is_numpys_kth_of_the_sorted_row():
    """The radix select against NumPy's sort, with repeats, signed zeros, negatives, infinities and
    bf16 inputs, for k from 1 to the whole row."""
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [
            rng.normal(0, 3, (3, 97)),
            rng.integers(-3, 4, (2, 97)).astype(np.float64),  # many repeats
            np.where(rng.random((2, 97)) < 0.5, -0.0, 0.0),
            np.concatenate([[np.inf, -np.inf, 1e30, -1e-30], rng.normal(0, 1e-3, 93)])[None],
        ]
    ).astype(np.float32)
    # One program for every k (k a traced argument): eagerly, each op dispatches and compiles on its own.
    kth = jax.jit(kth_largest)
    for k in (1, 2, 5, 40, 96, 97):
        expected = np.sort(rows, axis=-1)[:, -k]
        np.testing.assert_array_equal(np.asarray(kth(jnp.asarray(rows), k)), expected)
        np.testing.assert_array_equal(np.asarray(jax.lax.top_k(jnp.asarray(rows), k)[0][:, -1]), expected)
    bf16 = jnp.asarray(rows[:3], jnp.bfloat16)
    expected = np.sort(np.asarray(bf16, np.float32), axis=-1)[:, -7]
    np.testing.assert_array_equal(np.asarray(kth(bf16, 7)), expected)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="decoding layers: expected one of unrolled, scan, found 'loop'"):
        DecodeOptions(layers='loop')
    with pytest.raises(ValueError, match='positions_per_step: expected at least 1, found 0'):
        DecodeOptions(positions_per_step=0)
    with pytest.raises(ValueError, match="top_k_method: expected one of sort, select, found 'heap'"):
        DecodeOptions(top_k_method='heap')


def test_bad_lengths_and_prompts():
    graphdef, params = _model_and_params(GPT2, GPT2_SMALL)
    with pytest.raises(ValueError, match='decoding length'):
        Decoder(graphdef, GPT2_SMALL, batch_size=1, length=GPT2_SMALL.max_seq_len + 1)
    decoder = Decoder(graphdef, GPT2_SMALL, batch_size=1, length=8)
    with pytest.raises(ValueError, match='prompt: expected 1..7 tokens'):
        decoder(params, list(range(8)), jax.random.key(0))
    with pytest.raises(ValueError, match='token ids: expected 0..49, found 50'):
        decoder(params, [50], jax.random.key(0))


def test_decoding_under_the_trainers_mesh_gives_the_same_tokens():
    """LLaMA-3 params (GQA, the most sharded tensors) placed by the trainer's own rules
    (parallel/sharding.py) on data 2 x fsdp 2 x tensor 2 of the 8 fake CPU devices (conftest.py):
    greedy decoding gives the unsharded run's tokens. One family only: each costs ~10 s here."""
    cls, config = LLaMA3, LLAMA_SMALL
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxtrain.parallel import sharding

    graphdef, params = _model_and_params(cls, config, seed=5)
    mesh = jax.make_mesh((2, 2, 2), ('data', 'fsdp', 'tensor'), axis_types=(AxisType.Auto,) * 3)
    placed = sharding.put_global(params, sharding.parameter_shardings(params, mesh))
    assert any('tensor' in str(leaf.sharding.spec) for leaf in jax.tree.leaves(placed))
    plain = _decoder(cls, config, 2, 0)  # the greedy test's
    replicated = NamedSharding(mesh, P())
    sharded = Decoder(graphdef, config, batch_size=2, length=LENGTH, top_k=0, out_sharding=replicated)
    np.testing.assert_array_equal(
        sharded(placed, [1, 2], jax.random.key(0), 0.0), plain(params, [1, 2], jax.random.key(0), 0.0)
    )
