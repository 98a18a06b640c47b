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


# 64-blocks, 128 in the backward; one short block, GQA
@pytest.mark.slow
@pytest.mark.parametrize('T,N,K', [(128, 2, 2), (40, 4, 2)])
def test_pallas_kernel_matches_reference_forward_and_backward(T, N, K):
    # Off a GPU the Pallas kernel runs in its interpreter, which executes the same program.
    q, k, v = _qkv(T, N, K)
    group = N // K
    expected = ref._causal_attention(q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2))
    upstream = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)

    def grads(implementation):
        loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, implementation) * upstream)
        # Jitted: eagerly, each op around the kernels dispatches and compiles on its own.
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    # The kernel's forward and its gradients in one program: d(sum(out * upstream))/dout = upstream.
    def forward_and_grads(q, k, v):
        out, vjp = jax.vjp(lambda q, k, v: causal_attention(q, k, v, 'pallas'), q, k, v)
        return out, vjp(jnp.broadcast_to(upstream, out.shape))

    got, pallas_grads = jax.jit(forward_and_grads)(q, k, v)
    np.testing.assert_allclose(np.asarray(got).reshape(expected.shape), expected, atol=2e-5)
    for got, want in zip(pallas_grads, grads('xla')):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize(
    'requested,deterministic,scan_layers,expected',
    [
        ('auto', False, True, 'cudnn'),
        ('auto', False, False, 'cudnn'),
        ('auto', True, True, 'cudnn'),  # one deterministic cuDNN call inside the scan works
        ('auto', True, False, 'cudnn'),  # unrolled: its calls made distinct (distinct_calls)
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
    # Deterministic fp16 with unrolled layers: Pallas for 'auto'; cuDNN refused (fp16's range
    # cannot take distinct_calls' power-of-two scaling).
    assert resolve_attention('auto', jnp.float16, deterministic=True, scan_layers=False) == 'pallas'
    with pytest.raises(ValueError, match='needs dtype bfloat16.*found float16'):
        resolve_attention('cudnn', jnp.float16, deterministic=True, scan_layers=False)
    assert resolve_attention('cudnn', jnp.bfloat16, deterministic=True, scan_layers=False) == 'cudnn'
    with pytest.raises(ValueError, match='multiple of it; found 1000'):
        resolve_attention('pallas', jnp.bfloat16, seq_len=1000)
    assert resolve_attention('pallas', jnp.bfloat16, seq_len=1024) == 'pallas'
    # XLA cannot split the Pallas call over a mesh: more than one device is refused, 'auto' too.
    with pytest.raises(ValueError, match="pallas runs on one device only; found 2.*attention='cudnn'"):
        resolve_attention('auto', jnp.float16, deterministic=True, scan_layers=False, num_devices=2)
    assert (
        resolve_attention('auto', jnp.bfloat16, deterministic=True, scan_layers=True, num_devices=2)
        == 'cudnn'
    )
    with pytest.raises(ValueError, match="expected one of auto, xla, cudnn, pallas; found 'flash'"):
        resolve_attention('flash', jnp.bfloat16)


INDICES = (None, 0, 1, 2, 5, 30)


@pytest.mark.slow
@pytest.mark.xla_optimized  # bitwise equality of two programs, as a user's run compiles them
def test_power_of_two_scaled_queries_give_the_same_bits():
    # What makes unrolled deterministic cuDNN calls distinct must not change a bit of the
    # attention or its gradients; checked with XLA's attention, whose arithmetic is plain.
    from jaxtrain.models.attention import scaled_queries

    keys = jax.random.split(jax.random.key(3), 4)
    q, k, v, do = (jax.random.normal(key, (2, 16, 2, 8), jnp.bfloat16) * 3 for key in keys)

    def attend(q, k, v, index):
        q, scale = scaled_queries(q, index)
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation='xla')

    def forward_and_grads(q, k, v, index):
        loss = lambda q, k, v: jnp.sum(attend(q, k, v, index).astype(jnp.float32) * do)  # noqa: E731
        return attend(q, k, v, index), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    # The plain call and every index in one jitted program, as a user's run: eagerly, each op
    # compiles with XLA's optimizations on its own (and one program per index is a compile each).
    plain, *scaled = jax.jit(lambda q, k, v: [forward_and_grads(q, k, v, i) for i in (None, *INDICES)])(
        q, k, v
    )
    for index, each in zip(INDICES, scaled, strict=True):
        for got, want in zip(jax.tree.leaves(each), jax.tree.leaves(plain), strict=True):
            np.testing.assert_array_equal(
                np.asarray(got, np.float32), np.asarray(want, np.float32), err_msg=f'index {index}'
            )


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
@pytest.mark.parametrize('deterministic', [True, False])
def test_unrolled_layers_trace_distinct_cudnn_scales(monkeypatch, deterministic, family):
    # Each unrolled layer's deterministic cuDNN call must differ (XLA's graph cache): the
    # scales traced. Fast runs keep the plain scale (the scaling costs time).
    from flax import nnx

    from jaxtrain.models import attention as attention_module
    from jaxtrain.models.gpt2 import GPT2, GPT2Config
    from jaxtrain.models.llama3 import LLaMA3, LLaMA3Config

    seen = []
    real = jax.nn.dot_product_attention

    def recording(q, k, v, *, scale, is_causal, implementation):
        seen.append(scale)
        return real(q, k, v, scale=scale, is_causal=is_causal, implementation='xla')

    monkeypatch.setattr(attention_module.jax.nn, 'dot_product_attention', recording)
    if family == 'gpt2':
        config = GPT2Config(
            max_seq_len=8, vocab_size=30, padded_vocab_size=32, num_layers=4, num_heads=2, channels=8
        )
        cls = GPT2
    else:  # grouped queries: 4 query heads over 2 key/value heads
        config = LLaMA3Config(
            max_seq_len=8,
            vocab_size=30,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            channels=16,
            multiple_of=8,
        )
        cls = LLaMA3
    options = dict(dtype=jnp.bfloat16, attention='cudnn', scan_layers=False, deterministic=deterministic)
    # Traced only (what records the scales): an eager init and forward compile every op.
    jax.eval_shape(lambda: cls(config, **options, rngs=nnx.Rngs(0))(jnp.zeros((1, 8), jnp.int32)))
    H = 4
    assert seen == [2.0**-e / np.sqrt(H) for e in ((0, 1, -1, 2) if deterministic else (0, 0, 0, 0))]
