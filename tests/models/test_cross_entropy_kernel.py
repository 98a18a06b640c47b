"""The fused Pallas cross-entropy kernel (run by Pallas' interpreter on CPU) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.models import vocab_table
from jaxtrain.models.vocab_table import BLOCK, resolve_cross_entropy, softmax_cross_entropy


def _numpy_loss_and_grad(logits_NxV, targets_N, vocab_size, scale):
    x = logits_NxV.astype(np.float64)[:, :vocab_size]
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    rows = np.arange(len(targets_N))
    grad = np.exp(x - lse[:, None])
    grad[rows, targets_N] -= 1
    full = np.zeros(logits_NxV.shape)
    full[:, :vocab_size] = grad * scale
    return lse - x[rows, targets_N], full


def test_rows_over_several_blocks_match_numpy():
    # Three blocks, the last one partial; padded columns from vocab_size on. Row 0's maximum sits
    # in the last block (the running max is rescaled twice), row 1's in the first, and row 2's
    # target is in a later block than its maximum.
    V, vocab = 2 * BLOCK + 300, 2 * BLOCK + 250
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, V)) * 2).astype(np.float32)
    logits[0, 2 * BLOCK + 7] = 30.0
    logits[1, 5] = 25.0
    logits[:, vocab:] = 80.0  # huge padding logits must not leak into the loss or gradient
    targets = np.array([2 * BLOCK + 7, BLOCK + 3, 2 * BLOCK + 100])
    logits_bf16 = jnp.asarray(logits, jnp.bfloat16)

    loss, grad = softmax_cross_entropy(logits_bf16, jnp.asarray(targets), vocab, 0.25, True, interpret=True)
    want_loss, want_grad = _numpy_loss_and_grad(np.asarray(logits_bf16, np.float32), targets, vocab, 0.25)
    np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-5, atol=1e-5)
    assert grad.dtype == jnp.bfloat16
    # bf16 output: within half an ulp of bf16 (2^-8 relative) of the exact gradient (tiny
    # probabilities within fp32 exp rounding).
    np.testing.assert_allclose(np.asarray(grad, np.float32), want_grad, rtol=2**-8, atol=1e-8)
    assert not np.asarray(grad, np.float32)[:, vocab:].any()

    loss_only, no_grad = softmax_cross_entropy(
        logits_bf16, jnp.asarray(targets), vocab, 0.25, False, interpret=True
    )
    assert no_grad is None
    np.testing.assert_array_equal(np.asarray(loss_only), np.asarray(loss))


def test_auto_takes_pallas_only_on_one_gpu_in_half_precision(monkeypatch):
    assert resolve_cross_entropy('auto', jnp.bfloat16) == 'xla'  # this is a CPU
    monkeypatch.setattr(vocab_table.jax, 'default_backend', lambda: 'gpu')
    assert resolve_cross_entropy('auto', jnp.bfloat16) == 'pallas'
    assert resolve_cross_entropy('auto', jnp.float32) == 'xla'
    assert resolve_cross_entropy('auto', jnp.bfloat16, num_devices=2) == 'xla'
    with pytest.raises(ValueError, match='one device only; found 2'):
        resolve_cross_entropy('pallas', jnp.bfloat16, num_devices=2)


def test_refusals_name_the_key_and_the_choice():
    with pytest.raises(ValueError, match=r"cross_entropy: expected one of auto, xla, pallas; found 'triton'"):
        resolve_cross_entropy('triton', jnp.bfloat16)
    assert jax.default_backend() == 'cpu'
    with pytest.raises(ValueError, match="pallas needs a GPU; found backend 'cpu'"):
        resolve_cross_entropy('pallas', jnp.bfloat16)
