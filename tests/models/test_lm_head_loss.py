"""The fused head + cross-entropy against a plain autodiff formulation and the NumPy loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from jaxtrain.models import vocab_table
from jaxtrain.models.vocab_table import lm_head_cross_entropy, num_chunks


def _plain_loss(h_BxTxC, w, targets_BxT, vocab_size, vocab_axis):
    """What the trainer computed before fusing: full logits, fp32 log-softmax, autodiff."""
    w_VxC = w if vocab_axis == 0 else w.T
    logits = jnp.einsum('btc,vc->btv', h_BxTxC, w_VxC.astype(h_BxTxC.dtype)).astype(jnp.float32)
    logits = logits[..., :vocab_size]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets_BxT[..., None], axis=-1))


def _inputs(B=3, T=8, C=16, V=40, Vp=48, vocab_axis=0, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(B, T, C)), jnp.float32)
    w = rng.normal(size=(Vp, C)).astype(np.float32)
    w[V:] = rng.normal(size=(Vp - V, C)) * 50  # huge padding rows: must not leak into the loss
    w = jnp.asarray(w if vocab_axis == 0 else w.T)
    targets = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    return h, w, targets, V


@functools.cache
def _plain_value_and_grads(vocab_axis):
    """The plain loss and gradients on _inputs(vocab_axis=...): one per layout for the kernels and
    chunk sizes compared with it."""
    h, w, targets, V = _inputs(vocab_axis=vocab_axis)
    plain = jax.jit(jax.value_and_grad(_plain_loss, argnums=(0, 1)), static_argnums=(3, 4))
    return plain(h, w, targets, V, vocab_axis)


@pytest.mark.parametrize('kernel', ['xla', 'pallas'])  # pallas: through Pallas' interpreter on CPU
@pytest.mark.parametrize('vocab_axis', [0, 1])
@pytest.mark.parametrize('chunk_bytes', [1 << 30, 3 * 4 * 48 * 2])  # 1 chunk; 4 chunks of T=2
def test_loss_and_gradients_match_plain_autodiff(vocab_axis, chunk_bytes, kernel, monkeypatch):
    monkeypatch.setattr(vocab_table, '_CHUNK_BYTES', chunk_bytes)
    h, w, targets, V = _inputs(vocab_axis=vocab_axis)
    expected_chunks = 1 if chunk_bytes == 1 << 30 else 4
    assert num_chunks(3, 8, 48, 4) == expected_chunks

    fused = jax.jit(jax.value_and_grad(lm_head_cross_entropy, argnums=(0, 1)), static_argnums=(3, 4, 5))
    loss, (dh, dw) = fused(h, w, targets, V, vocab_axis, kernel)
    plain_loss, (plain_dh, plain_dw) = _plain_value_and_grads(vocab_axis)

    w_VxC = np.asarray(w if vocab_axis == 0 else w.T)
    numpy_loss = ref.cross_entropy(np.asarray(h) @ w_VxC.T, np.asarray(targets), V)
    assert float(loss) == pytest.approx(numpy_loss, rel=1e-6)
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    np.testing.assert_allclose(dh, plain_dh, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dw, plain_dw, rtol=1e-5, atol=1e-7)
    padding_rows = np.asarray(dw)[V:] if vocab_axis == 0 else np.asarray(dw)[:, V:]
    assert not padding_rows.any()
    # Without differentiation the primal path gives the same number.
    assert float(
        jax.jit(lm_head_cross_entropy, static_argnums=(3, 4, 5))(h, w, targets, V, vocab_axis, kernel)
    ) == (pytest.approx(float(loss), rel=1e-6))


def test_cotangent_scales_the_gradients():
    h, w, targets, V = _inputs(seed=1)
    # Jitted: eagerly, each op dispatches and compiles on its own.
    grads = jax.jit(jax.grad(lambda h, w: 3.0 * lm_head_cross_entropy(h, w, targets, V, 0), argnums=(0, 1)))(
        h, w
    )
    plain = jax.jit(jax.grad(lambda h, w: 3.0 * _plain_loss(h, w, targets, V, 0), argnums=(0, 1)))(h, w)
    for a, b in zip(grads, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_hidden_states_give_bf16_dh_and_fp32_dw():
    h, w, targets, V = _inputs(seed=2)
    h16 = h.astype(jnp.bfloat16)
    # Jitted (V and the vocabulary axis static): eagerly, each op dispatches and compiles on its own.
    fused = jax.jit(jax.value_and_grad(lm_head_cross_entropy, argnums=(0, 1)), static_argnums=(3, 4))
    loss, (dh, dw) = fused(h16, w, targets, V, 0)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    plain = jax.jit(jax.value_and_grad(_plain_loss, argnums=(0, 1)), static_argnums=(3, 4))
    plain_loss, (_, plain_dw) = plain(h16, w, targets, V, 0)
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-3)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(plain_dw), rtol=0.05, atol=2e-3)


def test_chunk_count_is_the_fewest_divisor_that_fits():
    gib = 1 << 30
    # GPT-2 124M shape: batch 16 x 1024, Vp 50304, bf16 logits = 1.65 GB -> 2 chunks of 512.
    assert num_chunks(16, 1024, 50304, 2) == 2
    assert num_chunks(1, 1024, 1000, 2) == 1
    # Just over half a GiB per position: only single positions fit, so T=6 takes 6 chunks.
    assert num_chunks(1, 6, gib // 2 + 1, 1) == 6
    assert num_chunks(1, 6, gib // 3, 1) == 2
