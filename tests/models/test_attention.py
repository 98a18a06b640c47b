"""The attention kernels against the NumPy reference, and which kernel a run gets."""

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from jaxtrain.models.attention import causal_attention, resolve_attention


def _qkv(T, N, K, H=16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(2, T, heads, H)).astype(np.float32) for heads in (N, K, K)]


@pytest.mark.parametrize('T,N,K', [(128, 2, 2), (40, 4, 2)])  # 64-blocks, 128 in the backward; one short block, GQA
def test_pallas_kernel_matches_reference_forward_and_backward(T, N, K):
    # Off a GPU the Pallas kernel runs in its interpreter, which executes the same program.
    q, k, v = _qkv(T, N, K)
    group = N // K
    expected = ref._causal_attention(q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2))
    got = np.asarray(causal_attention(q, k, v, 'pallas'))
    np.testing.assert_allclose(got.reshape(expected.shape), expected, atol=2e-5)

    upstream = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)

    def grads(implementation):
        loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, implementation) * upstream)
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for got, want in zip(grads('pallas'), grads('xla')):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize(
    'requested,deterministic,scan_layers,expected',
    [
        ('auto', False, True, 'cudnn'),
        ('auto', False, False, 'cudnn'),
        ('auto', True, True, 'cudnn'),  # one deterministic cuDNN call inside the scan works
        ('auto', True, False, 'pallas'),  # unrolled deterministic cuDNN fails on jax 0.11.2
        ('pallas', False, True, 'pallas'),
        ('xla', True, False, 'xla'),
    ],
)
def test_choice_on_a_gpu_in_bf16(monkeypatch, requested, deterministic, scan_layers, expected):
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    chosen = resolve_attention(requested, jnp.bfloat16, deterministic=deterministic, scan_layers=scan_layers)
    assert chosen == expected


def test_cpu_and_fp32_take_xla_and_refuse_flash_kernels(monkeypatch):
    assert resolve_attention('auto', jnp.bfloat16, deterministic=True, scan_layers=False) == 'xla'
    with pytest.raises(ValueError, match='pallas needs a GPU'):
        resolve_attention('pallas', jnp.bfloat16)
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    assert resolve_attention('auto', jnp.float32, deterministic=True, scan_layers=False) == 'xla'


def test_unusable_combinations_are_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    with pytest.raises(ValueError, match='scan_layers=true'):
        resolve_attention('cudnn', jnp.bfloat16, deterministic=True, scan_layers=False)
    with pytest.raises(ValueError, match='multiple of it; found 1000'):
        resolve_attention('pallas', jnp.bfloat16, seq_len=1000)
    assert resolve_attention('pallas', jnp.bfloat16, seq_len=1024) == 'pallas'
    # XLA cannot split the Pallas call over a mesh: more than one device is refused, 'auto' too.
    with pytest.raises(ValueError, match='pallas runs on one device only; found 2.*--scan_layers true'):
        resolve_attention('auto', jnp.bfloat16, deterministic=True, scan_layers=False, num_devices=2)
    assert (
        resolve_attention('auto', jnp.bfloat16, deterministic=True, scan_layers=True, num_devices=2)
        == 'cudnn'
    )
    with pytest.raises(ValueError, match="expected one of auto, xla, cudnn, pallas; found 'flash'"):
        resolve_attention('flash', jnp.bfloat16)
