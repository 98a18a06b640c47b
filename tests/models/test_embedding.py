"""The embedding lookup's sorted-segment-sum gradient against NumPy's unbuffered add."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.models.vocab_table import embedding_lookup


@jax.jit
def _grad(table, ids, upstream):
    """One jitted program per shape (ids and upstream its arguments), traced once for repeated calls."""
    return jax.grad(lambda t: jnp.sum(embedding_lookup(t, ids).astype(jnp.float32) * upstream))(table)


@pytest.mark.parametrize('V,shape', [(37, (3, 50)), (1000, (2, 7)), (5, (64,))])
def test_gradient_is_the_sum_of_rows_per_id(V, shape):
    rng = np.random.default_rng(V)
    C = 6
    table = jnp.asarray(rng.normal(size=(V, C)), jnp.float32)
    ids = rng.integers(0, V, shape)
    upstream = rng.normal(size=shape + (C,)).astype(np.float32)
    expected = np.zeros((V, C), np.float64)
    np.add.at(expected, ids.reshape(-1), upstream.reshape(-1, C))
    got = _grad(table, jnp.asarray(ids), jnp.asarray(upstream))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # Rows of ids that never occur are exactly zero.
    absent = np.setdiff1d(np.arange(V), ids)
    assert not np.asarray(got)[absent].any()


def test_lookup_is_a_gather_and_the_gradient_keeps_the_table_dtype():
    table = jnp.arange(12.0, dtype=jnp.bfloat16).reshape(4, 3)
    ids = jnp.array([[3, 0, 3]])
    np.testing.assert_array_equal(embedding_lookup(table, ids), np.asarray(table)[[[3, 0, 3]]])
    grad = _grad(table, ids, jnp.ones((1, 3, 3)))
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(grad, np.float32)[:, 0], [1, 0, 0, 2])


@pytest.mark.slow
def test_many_repeats_of_one_id_sum_exactly_in_a_fixed_order():
    # 4096 copies of one id: every run must give the same bits (no atomics anywhere).
    ids = jnp.zeros((4096,), jnp.int32).at[::7].set(1)
    upstream = jnp.asarray(np.random.default_rng(0).normal(size=(4096, 8)), jnp.float32)
    table = jnp.zeros((2, 8))
    first = np.asarray(_grad(table, ids, upstream))
    assert all(np.array_equal(first, np.asarray(_grad(table, ids, upstream))) for _ in range(3))
    np.testing.assert_allclose(first[1], np.asarray(upstream)[::7].sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_scatter_and_sorted_gradients_agree_in_a_model():
    # The model option picks the backward only: same loss, gradients equal up to sum order.
    from flax import nnx

    from jaxtrain.models.gpt2 import GPT2, GPT2Config

    config = GPT2Config(
        max_seq_len=8, vocab_size=30, padded_vocab_size=32, num_layers=1, num_heads=2, channels=8
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 30, (2, 8)))

    # The shapes alone, then random values from NumPy: an init (eager or in the jitted program)
    # costs more to compile than the gradient itself.
    abstract = nnx.eval_shape(lambda: GPT2(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), jnp.float32),
        nnx.to_pure_dict(nnx.split(abstract, nnx.Param)[1]),
    )

    def wte_grad(deterministic):
        graphdef = nnx.split(
            nnx.eval_shape(lambda: GPT2(config, deterministic=deterministic, rngs=nnx.Rngs(0))), nnx.Param
        )[0]
        loss = lambda p: jnp.sum(nnx.merge(graphdef, nnx.State(p))(tokens) ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss))(params)['wte']['embedding']  # one program: eagerly, op by op

    np.testing.assert_allclose(wte_grad(True), wte_grad(False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('block', [1, 4, 64])
def test_block_running_sums_carry_ids_across_blocks(monkeypatch, block):
    # Long runs of a few ids cross many blocks (and whole blocks of one id); N is no multiple
    # of the block. Each id's sum against NumPy's, for block sizes down to one row.
    from jaxtrain.models import vocab_table

    monkeypatch.setattr(vocab_table, 'SEGMENT_BLOCK', block)
    rng = np.random.default_rng(block)
    ids = np.repeat([2, 0, 4, 1], [3, 41, 1, 26])[rng.permutation(71)]
    rows = rng.normal(size=(71, 3)).astype(np.float32)
    expected = np.zeros((6, 3))
    np.add.at(expected, ids, rows)
    got = jax.jit(vocab_table._segment_sum_by_sort, static_argnums=2)(jnp.asarray(rows), jnp.asarray(ids), 6)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not np.asarray(got)[[3, 5]].any()  # ids 3 and 5 never occur
