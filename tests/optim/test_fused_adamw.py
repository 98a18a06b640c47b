"""`--fused_adamw`: the Pallas AdamW kernels (run by Pallas' interpreter on CPU) against a NumPy
AdamW written from llm.c's update, and against the optax path they stand in for."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxtrain.config import fit_checks
from jaxtrain.config.checks import check_config
from jaxtrain.models.gpt2 import GPT2, GPT2Config
from jaxtrain.optim import adamw_kernel
from jaxtrain.optim.fused_adamw import FusedAdam, apply_gradients
from jaxtrain.optim.optimizer import build_optimizer, decay_mask
from jaxtrain.train.step import TrainState, make_train_step
from trainer_runs import load_config, random_shard, train

B1, B2, EPS = 0.9, 0.95, 1e-8
# Shapes off the kernel's block (256 in these tests): partial last blocks, a tensor smaller than
# one block, and 2-D tensors (decayed) beside 1-D ones (not decayed).
SHAPES = {'h': {'kernel': (33, 70), 'bias': (70,)}, 'wte': (40, 25), 'ln': {'scale': (3,)}}


def _tree(seed, scale=1.0, positive=False):
    rng = np.random.default_rng(seed)
    draw = lambda shape: np.float32(scale) * rng.standard_normal(shape).astype(np.float32)
    tree = jax.tree.map(draw, SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    return jax.tree.map(lambda x: jnp.asarray(np.abs(x) if positive else x), tree)


def _numpy_adamw(params, grads_per_step, lrs, weight_decay, grad_clip):
    """llm.c's AdamW (gpt2_update) in float64, with InfiniTrain's global-norm clipping before it:
    the (params, m, v) after each step."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    m = jax.tree.map(np.zeros_like, p)
    v = jax.tree.map(np.zeros_like, p)
    history = []
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        g = jax.tree.map(lambda x: np.asarray(x, np.float64), grads)
        norm = np.sqrt(sum(np.sum(x * x) for x in jax.tree.leaves(g)))
        if grad_clip and norm >= grad_clip:
            g = jax.tree.map(lambda x: x / norm * grad_clip, g)

        def update(p, g, m, v):
            m = B1 * m + (1 - B1) * g
            v = B2 * v + (1 - B2) * g * g
            m_hat, v_hat = m / (1 - B1**t), v / (1 - B2**t)
            decay = weight_decay if p.ndim >= 2 else 0.0
            return p - lr * (m_hat / (np.sqrt(v_hat) + EPS) + decay * p), m, v

        out = jax.tree.map(update, p, g, m, v)
        is_triple = lambda x: isinstance(x, tuple)
        p, m, v = (jax.tree.map(lambda o, i=i: o[i], out, is_leaf=is_triple) for i in range(3))
        history.append((p, m, v))
    return history


def _fused(weight_decay, grad_clip, schedule=None, **kernel):
    schedule = schedule or optax.cosine_decay_schedule(1e-2, 10)
    reference = optax.adamw(schedule, b1=B1, b2=B2, eps=EPS, weight_decay=weight_decay, mask=decay_mask)
    if grad_clip:
        reference = optax.chain(optax.clip_by_global_norm(grad_clip), reference)
    fused = FusedAdam(
        reference,
        schedule,
        b1=B1,
        b2=B2,
        eps=EPS,
        weight_decay=weight_decay,
        mask=decay_mask,
        grad_clip=grad_clip,
        interpret=True,
        **({'block': 256, 'tensors_per_call': 2} | kernel),
    )
    return reference, fused, schedule


def _adam_moments(state):
    nodes = jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
    return next(n for n in nodes if isinstance(n, optax.ScaleByAdamState))


@pytest.mark.parametrize('grad_clip', [0.0, 0.5])  # 0.5 clips every step (the norms are ~7)
def test_steps_match_numpy_adamw(grad_clip):
    _, fused, schedule = _fused(weight_decay=0.1, grad_clip=grad_clip)
    params = _tree(0)
    grads = [_tree(1 + s, scale=0.2) for s in range(3)]
    want = _numpy_adamw(params, grads, [float(schedule(s)) for s in range(3)], 0.1, grad_clip)
    state, p = fused.init(params), params
    step = jax.jit(fused.apply_gradients)
    for t in range(3):
        p, state = step(grads[t], state, p)
        adam = _adam_moments(state)
        want_p, want_m, want_v = want[t]
        # atol: a few float32 roundings of the terms' sizes (p ~ 1, m ~ 0.2, v ~ 0.04), for
        # elements where the terms cancel.
        for got, expected, atol in ((p, want_p, 5e-7), (adam.mu, want_m, 1e-7), (adam.nu, want_v, 1e-8)):
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
                np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=2e-6, atol=atol)
        assert int(adam.count) == t + 1


def _ulps_apart(a, b, scale):
    """|a - b| in units of float32's spacing at `scale` (the size of the terms that were summed)."""
    return np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / np.spacing(np.float32(scale))


@pytest.mark.parametrize('grad_clip', [0.0, 0.5])
def test_one_step_agrees_with_optax_up_to_fma_contraction(grad_clip):
    # Same state in, one step: the kernel's arithmetic is optax's operation for operation. XLA
    # contracts a multiply-add into one FMA (one rounding instead of two) or not, fusion by
    # fusion, so each moment may differ by one rounding of its terms, and p' by one rounding of p.
    reference, fused, _ = _fused(weight_decay=0.1, grad_clip=grad_clip)
    params, grads = _tree(0), _tree(1, scale=0.2)
    state = reference.init(params)
    state = jax.tree.map(
        lambda n: (
            n._replace(count=jnp.int32(4), mu=_tree(2, 0.1), nu=_tree(3, 0.01, positive=True))
            if isinstance(n, optax.ScaleByAdamState)
            else n
        ),
        state,
        is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState),
    )
    want_p, want_state = jax.jit(lambda *a: apply_gradients(reference, *a))(grads, state, params)
    got_p, got_state = jax.jit(lambda *a: apply_gradients(fused, *a))(grads, state, params)
    assert jax.tree.structure(got_state) == jax.tree.structure(want_state)
    for a, b in zip(jax.tree.leaves(got_state), jax.tree.leaves(want_state)):
        if a.dtype == jnp.int32:  # the counts
            assert int(a) == int(b)
    got, want, old = _adam_moments(got_state), _adam_moments(want_state), _adam_moments(state)
    for a, b, g, m in zip(*map(jax.tree.leaves, (got.mu, want.mu, grads, old.mu))):
        assert _ulps_apart(a, b, np.abs(g).max() + np.abs(m).max()).max() <= 1
    for a, b, g, v in zip(*map(jax.tree.leaves, (got.nu, want.nu, grads, old.nu))):
        assert _ulps_apart(a, b, np.square(g).max() + np.abs(v).max()).max() <= 1
    for a, b, p in zip(*map(jax.tree.leaves, (got_p, want_p, params))):
        assert _ulps_apart(a, b, np.abs(p).max()).max() <= 1


def test_runs_are_bitwise_identical_and_state_keeps_optax_layout():
    reference, fused, _ = _fused(weight_decay=0.1, grad_clip=1.0, tensors_per_call=16)
    params = _tree(0)
    assert jax.tree.structure(fused.init(params)) == jax.tree.structure(reference.init(params))
    runs = []
    for _ in range(2):
        step = jax.jit(fused.apply_gradients)  # a fresh compile each time
        p, state = params, fused.init(params)
        for s in range(2):
            p, state = step(_tree(5 + s, scale=0.2), state, p)
        runs.append(jax.tree.leaves((p, state)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_weight_decay_only_where_the_mask_says_and_adam_has_none():
    # Zero gradients, so the update is the decay alone: matrices shrink by lr·wd, the rest stay.
    params = {'kernel': jnp.ones((3, 3)), 'bias': jnp.ones((3,))}
    zeros = jax.tree.map(jnp.zeros_like, params)
    for optimizer, shrunk in (('adamw', 1 - 0.1 * 0.5), ('adam', 1.0)):
        config = load_config(
            'gpt2', learning_rate=0.1, weight_decay=0.5, optimizer=optimizer, fused_adamw=True
        )
        tx, _ = build_optimizer(config)
        assert isinstance(tx, FusedAdam)
        new, _ = jax.jit(tx.apply_gradients)(zeros, tx.init(params), params)
        np.testing.assert_allclose(new['kernel'], shrunk, rtol=1e-7)
        np.testing.assert_array_equal(new['bias'], 1.0)


def test_kernel_direct_single_tensor_matches_formula():
    # adam_update on its own, a tensor of three blocks and a bit, step 1: m = (1-b1) g,
    # v = (1-b2) g², and p' = p - lr·(g/(|g|+eps) + wd·p).
    rng = np.random.default_rng(7)
    p, g = (rng.standard_normal(3 * 256 + 5).astype(np.float32) for _ in range(2))
    zero = np.zeros_like(p)
    scalars = (1 - np.float32(B1), 1 - np.float32(B2), np.float32(-0.01))
    (new_p,), (m,), (v,) = adamw_kernel.adam_update(
        [jnp.asarray(p)], [jnp.asarray(g)], [jnp.asarray(zero)], [jnp.asarray(zero)], [True], scalars,
        b1=B1, b2=B2, eps=EPS, weight_decay=0.1, block=256, interpret=True,
    )  # fmt: skip
    p64, g64 = p.astype(np.float64), g.astype(np.float64)
    np.testing.assert_allclose(m, (1 - B1) * g64, rtol=1e-6)
    np.testing.assert_allclose(v, (1 - B2) * g64 * g64, rtol=1e-6)
    np.testing.assert_allclose(
        new_p, p64 - 0.01 * (g64 / (np.abs(g64) + EPS) + 0.1 * p64), rtol=1e-6, atol=1e-7
    )


CONFIG = GPT2Config(
    max_seq_len=16, vocab_size=40, padded_vocab_size=48, num_layers=2, num_heads=2, channels=16
)


def test_train_step_with_the_key_follows_the_optax_step():
    graphdef, state = nnx.split(GPT2(CONFIG, rngs=nnx.Rngs(0)), nnx.Param)
    params = nnx.to_pure_dict(state)
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (4, 9))
    inputs, targets = tokens[None, :, :-1], tokens[None, :, 1:]
    runs = {}
    for fused in (False, True):
        config = load_config('gpt2', learning_rate=1e-2, weight_decay=0.1, grad_clip=1.0, fused_adamw=fused)
        tx, _ = build_optimizer(config)
        step = jax.jit(make_train_step(graphdef, tx, CONFIG.vocab_size))
        train_state = TrainState(
            step=jnp.int32(0),
            data_position=jnp.int32(0),
            params=params,
            opt_state=tx.init(params),
            rng=jax.random.key_data(jax.random.PRNGKey(0)),
        )
        losses = []
        for _ in range(3):
            train_state, metrics = step(train_state, inputs, targets)
            losses.append(float(metrics['loss']))
        runs[fused] = losses, train_state
    (plain_losses, plain), (fused_losses, fused) = runs[False], runs[True]
    np.testing.assert_allclose(fused_losses, plain_losses, rtol=1e-6)
    assert jax.tree.structure(fused.opt_state) == jax.tree.structure(plain.opt_state)
    assert int(_adam_moments(fused.opt_state).count) == int(fused.step) == 3
    # Adam divides by sqrt(v): where a gradient is near zero, an ulp of difference in it (from
    # the FMA contractions above) moves that element by up to lr, so the weights agree to a
    # small fraction of lr rather than to the ulp.
    for a, b in zip(jax.tree.leaves(fused.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-3 * 1e-2)


def test_config_refuses_sgd_many_devices_and_a_cpu(monkeypatch):
    with pytest.raises(ValueError, match="fused_adamw: expected a GPU, found 'cpu'"):
        check_config(load_config('gpt2', fused_adamw=True))
    monkeypatch.setenv(fit_checks.INTERPRET_ENV, '1')  # Pallas' interpreter, as the tests run it
    with pytest.raises(ValueError, match="fused_adamw: expected --optimizer adamw or adam .*found 'sgd'"):
        check_config(load_config('gpt2', optimizer='sgd', fused_adamw=True))
    with pytest.raises(ValueError, match='fused_adamw: expected one device .* found 2'):
        check_config(load_config('gpt2', num_devices=2, fused_adamw=True))
    check_config(load_config('gpt2', fused_adamw=True))


@pytest.mark.slow
def test_training_run_with_the_key_matches_one_without(tmp_path, monkeypatch):
    monkeypatch.setenv(fit_checks.INTERPRET_ENV, '1')
    shard = random_shard(tmp_path / 'train.bin')
    losses = {}
    for fused in (False, True):
        config = load_config(
            'gpt2',
            input_bin=shard,
            num_iteration=5,
            sample_every=0,
            learning_rate=1e-3,
            weight_decay=0.1,
            grad_clip=1.0,
            fused_adamw=fused,
            metrics_dir=str(tmp_path / f'metrics-{fused}'),
        )
        code, losses[fused], _ = train(config)
        assert code == 0
    assert sorted(losses[True]) == sorted(losses[False]) == list(range(1, 6))
    np.testing.assert_allclose(
        [losses[True][s] for s in range(1, 6)], [losses[False][s] for s in range(1, 6)], rtol=1e-5
    )
