"""The jitted train step on its own: accumulation, learning, and the optimizer's llm.c rules."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxtrain.models.gpt2 import GPT2, GPT2Config
from jaxtrain.optim.optimizer import build_optimizer, learning_rate_at
from jaxtrain.train.setup import TrainState, make_train_step
from trainer_runs import load_config

CONFIG = GPT2Config(
    max_seq_len=16, vocab_size=40, padded_vocab_size=48, num_layers=2, num_heads=2, channels=16
)


@functools.cache
def _setup():
    """The jitted step and its first state, built once for the file: the tests share the
    model's init and the step's compile (its arrays are immutable, nothing is donated)."""
    graphdef, state = nnx.split(GPT2(CONFIG, rngs=nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(state)
    tx, _ = build_optimizer(load_config('gpt2', learning_rate=1e-2))
    train_state = TrainState(
        step=jnp.int32(0),
        data_position=jnp.int32(0),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.PRNGKey(0)),
    )
    return jax.jit(make_train_step(graphdef, tx, CONFIG.vocab_size)), train_state


def _batch(rows, seed=0):
    tokens = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (rows, 9))
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.slow
def test_accumulated_step_equals_one_big_step():
    step, state = _setup()
    inputs, targets = _batch(4)
    big_state, big = step(state, inputs[None], targets[None])  # 1 micro-step of 4 rows
    acc_state, acc = step(state, inputs.reshape(2, 2, 8), targets.reshape(2, 2, 8))  # 2 of 2 rows
    assert float(acc['loss']) == pytest.approx(float(big['loss']), rel=1e-6)
    # The gradients, as AdamW's first moment holds them ((1 - b1)·g after one step), agree to
    # rounding. The parameters only to a thousandth of the step: a gradient near AdamW's eps
    # turns a rounding difference into an update anywhere between 0 and lr.
    acc_mu = optax.tree_utils.tree_get(acc_state.opt_state, 'mu')
    big_mu = optax.tree_utils.tree_get(big_state.opt_state, 'mu')
    assert len(jax.tree.leaves(acc_mu)) == len(jax.tree.leaves(acc_state.params))
    for a, b in zip(jax.tree.leaves(acc_mu), jax.tree.leaves(big_mu), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-9, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(acc_state.params), jax.tree.leaves(big_state.params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert int(acc_state.step) == int(big_state.step) == 1
    assert int(acc_state.data_position) == 1


@pytest.mark.slow
def test_loss_falls_on_a_repeated_batch():
    step, state = _setup()
    inputs, targets = _batch(4, seed=1)
    losses = []
    for _ in range(30):
        state, metrics = step(state, inputs[None], targets[None])
        losses.append(float(metrics['loss']))
    assert losses[0] == pytest.approx(np.log(CONFIG.vocab_size), abs=0.3)  # starts near uniform
    assert losses[-1] < 0.5 * losses[0] and all(np.isfinite(losses))


def test_weight_decay_touches_only_matrices():
    # With zero gradients (lr applied to decay only), AdamW must shrink 2-D tensors and leave
    # biases and LayerNorm scales exactly alone, as llm.c's CUDA trainer does.
    tx, _ = build_optimizer(load_config('gpt2', learning_rate=0.1, weight_decay=0.5))
    params = {'kernel': jnp.ones((3, 3)), 'bias': jnp.ones((3,)), 'ln': {'scale': jnp.ones((3,))}}
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new['kernel'], 1 - 0.1 * 0.5)
    np.testing.assert_array_equal(new['bias'], 1.0)
    np.testing.assert_array_equal(new['ln']['scale'], 1.0)


def test_adamw_first_step_matches_llmc_formula():
    # llm.c gpt2_update, t=1: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2,
    # theta -= lr * (g / (|g| + eps) + wd * theta).
    tx, _ = build_optimizer(load_config('gpt2', learning_rate=0.01, weight_decay=0.1, beta1=0.9, beta2=0.95))
    theta = jnp.array([[0.5, -2.0], [1.0, 3.0]])
    grad = jnp.array([[0.1, -0.3], [2.0, -1e-3]])
    updates, _ = tx.update(grad, tx.init(theta), theta)
    expected = theta - 0.01 * (grad / (jnp.abs(grad) + 1e-8) + 0.1 * theta)
    np.testing.assert_allclose(optax.apply_updates(theta, updates), expected, rtol=1e-6)


def test_sgd_is_plain_gradient_descent():
    tx, _ = build_optimizer(load_config('gpt2', optimizer='sgd', learning_rate=0.5))
    theta, grad = jnp.array([1.0, 2.0]), jnp.array([0.2, -0.4])
    updates, _ = tx.update(grad, tx.init(theta), theta)
    np.testing.assert_allclose(optax.apply_updates(theta, updates), [0.9, 2.2])


def _llmc_cosine(step, lr, warmup, total, final_frac):
    """llm.c's get_learning_rate_cosine (llmc/schedulers.h), transcribed."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_ratio = (step - warmup) / (total - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return lr * final_frac + coeff * (lr - lr * final_frac)


def test_cosine_schedule_is_llmc_s():
    _, schedule = build_optimizer(
        load_config(
            'gpt2',
            lr_schedule='cosine',
            warmup_steps=10,
            num_iteration=110,
            learning_rate=1.0,
            min_lr_ratio=0.1,
        )
    )
    assert float(schedule(0)) == pytest.approx(0.1) and float(schedule(9)) == pytest.approx(1.0)
    for step in range(110):
        assert float(schedule(step)) == pytest.approx(_llmc_cosine(step, 1.0, 10, 110, 0.1), abs=1e-6), step


def test_constant_schedule_warms_up_from_lr_over_warmup_not_from_zero():
    config = load_config('gpt2', warmup_steps=4, learning_rate=1e-3)
    _, schedule = build_optimizer(config)
    # the step line of step n prints the rate of schedule step n-1
    expected = [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]
    assert [learning_rate_at(schedule, s) for s in range(6)] == pytest.approx(expected)
