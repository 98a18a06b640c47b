"""Causal self-attention shared by GPT-2 and LLaMA-3, and the choice of kernel.

Axis letters: B batch, T time, N query heads, K key/value heads, H head dim.

Three kernels, measured on an H200 at GPT-2 124M, batch 16 x 1024:
- 'cudnn': cuDNN flash attention, the fastest (4.5 ms of a 35 ms step). With
  `--xla_gpu_deterministic_ops` XLA makes its backward deterministic, but on jax 0.11.2 a
  module holding more than one *identical* cuDNN attention backward then fails at run time
  (IndexError: map::at). The second call hits XLA's graph cache before the deterministic
  setting is written into it, and its compiled graph is then looked up under a key that
  was never stored (openxla/xla PR 46500 explains it). Deterministic unrolled layers
  therefore make their calls distinct (distinct_calls): layer i's call gets the scale
  2^-e_i / sqrt(H) and the queries 2^e_i q, which gives the same bits, since scaling by a
  power of two is exact in floating point. Measured on jax 0.11.2: identical calls fail,
  distinct ones run bitwise equal twice, and the deterministic step is 0.98x the fast one.
- 'pallas': JAX's Triton flash attention (jax.experimental.pallas.ops.gpu.attention). Its
  backward writes dq, dk and dv block by block without atomics, so it is deterministic
  with no flag at all. It is what deterministic fp16 runs with unrolled layers take (the
  power-of-two scaling would overflow fp16); in bf16 it made the deterministic step 0.94x
  the fast one, against cuDNN's 0.98x.
- 'xla': plain softmax(QK^T)V, for CPU and fp32 (5x slower than cuDNN on GPU).
"""

import contextlib
import contextvars
import math
import warnings

import jax
import jax.numpy as jnp

from jaxtrain.parallel import context_parallel

IMPLEMENTATIONS = ('auto', 'xla', 'cudnn', 'pallas')
# The Pallas kernel tiles time in blocks of this many steps (measured best of 32/64/128).
PALLAS_BLOCK = 64
# Its backward's kv blocks (and the dq blocks, which the backward's grid ties to them) are
# twice that where T allows: 9.17 against 9.55 ms for 12 layers' forward + backward on an
# H200.
PALLAS_BACKWARD_KV_BLOCK = 128

# Which call of a step the attention being traced is (distinct_calls); None: the only one.
_CALL_INDEX = contextvars.ContextVar('jaxtrain_attention_call', default=None)


@contextlib.contextmanager
def distinct_calls(index: int | None):
    """While tracing unrolled layer `index`: its cuDNN attention call gets a scale of its own
    (module docstring), so that no two calls of a step are identical. None: the plain call
    (fast runs, which need no distinct calls and skip the queries' scaling)."""
    token = _CALL_INDEX.set(index)
    try:
        yield
    finally:
        _CALL_INDEX.reset(token)


def power_of_two_exponent(index: int) -> int:
    """e_i for call `index`: 0, 1, -1, 2, -2, ... (distinct, and small for any layer count)."""
    return (index + 1) // 2 * (1 if index % 2 else -1)


def scaled_queries(q_BxTxNxH, index):
    """(2^e q, 2^-e / sqrt(H)) for call `index` (None: q and 1/sqrt(H)). The products q.k
    are scaled by 2^e exactly and the scale takes it back exactly, so the attention and its
    gradients are bitwise those of the plain call (bf16 has fp32's exponent range; fp16's
    would overflow or go subnormal, so only bf16 takes this)."""
    scale = 1 / math.sqrt(q_BxTxNxH.shape[-1])
    if index is None:
        return q_BxTxNxH, scale
    e = power_of_two_exponent(index)
    return q_BxTxNxH * jnp.asarray(2.0**e, q_BxTxNxH.dtype), scale * 2.0**-e


def resolve_attention(
    requested: str,
    compute_dtype,
    *,
    deterministic: bool = False,
    scan_layers: bool = True,
    seq_len=None,
    num_devices: int = 1,
) -> str:
    """Picks the attention kernel for `requested` in IMPLEMENTATIONS.

    The flash kernels exist only on NVIDIA GPUs and only for bf16/fp16. 'auto' takes
    cuDNN there, except deterministic fp16 runs with unrolled layers, which take Pallas (see
    the module docstring); XLA's reference attention everywhere else (CPU, fp32).

    The Pallas kernel is one device's: XLA cannot split its call over a mesh and would
    gather the whole batch onto every device, so it is refused on more than one.
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"attention: expected one of {', '.join(IMPLEMENTATIONS)}; found {requested!r}")
    half = jnp.dtype(compute_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    on_gpu = jax.default_backend() == 'gpu'
    # Deterministic cuDNN calls in unrolled layers must be made distinct, which only bf16 can.
    needs_distinct_calls = deterministic and not scan_layers
    can_be_distinct = jnp.dtype(compute_dtype) == jnp.dtype(jnp.bfloat16)
    if requested == 'auto':
        if not (on_gpu and half):
            return 'xla'
        if needs_distinct_calls and not can_be_distinct:
            requested = 'pallas'  # checked below like an explicit choice
        else:
            return 'cudnn'
    if requested in ('cudnn', 'pallas') and not (on_gpu and half):
        raise ValueError(
            f'attention: {requested} needs a GPU and dtype bfloat16; found backend '
            f"{jax.default_backend()!r} and dtype {jnp.dtype(compute_dtype).name}. Use attention='xla'."
        )
    if requested == 'cudnn' and needs_distinct_calls and not can_be_distinct:
        raise ValueError(
            'attention: cudnn with deterministic kernels and unrolled layers needs dtype bfloat16 (its '
            f'calls are made distinct by power-of-two scaling); found {jnp.dtype(compute_dtype).name}. '
            "Use attention='auto' or 'pallas', or --scan_layers true."
        )
    if requested == 'pallas' and num_devices > 1:
        raise ValueError(
            f'attention: pallas runs on one device only; found {num_devices}. For deterministic runs on '
            "several devices use attention='cudnn' (in bf16, or with --scan_layers true) or attention='xla'."
        )
    if requested == 'pallas' and seq_len is not None and seq_len > PALLAS_BLOCK and seq_len % PALLAS_BLOCK:
        raise ValueError(
            f'attention: pallas needs sequence_length <= {PALLAS_BLOCK} or a multiple of it; found '
            f"{seq_len}. Use attention='cudnn' with --scan_layers true."
        )
    return requested


def _pallas_attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH):
    with warnings.catch_warnings():
        # jax 0.11 marks the module deprecated in favour of tokamax, which the GPU stack lacks.
        warnings.simplefilter('ignore', DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention as pallas_mha

    T = q_BxTxNxH.shape[1]
    block = min(PALLAS_BLOCK, T)
    kv_block = PALLAS_BACKWARD_KV_BLOCK if T % PALLAS_BACKWARD_KV_BLOCK == 0 else block
    sizes = pallas_mha.BlockSizes(
        block_q=block,
        block_k=block,
        block_q_dkv=block,
        block_kv_dkv=kv_block,
        block_q_dq=kv_block,
        block_kv_dq=kv_block,
    )
    return pallas_mha.mha(
        q_BxTxNxH,
        k_BxTxNxH,
        v_BxTxNxH,
        None,
        sm_scale=1 / math.sqrt(q_BxTxNxH.shape[-1]),
        causal=True,
        block_sizes=sizes,
        # Off a GPU the kernel runs in Pallas' interpreter: slow, but it lets CPU tests check it.
        interpret=jax.default_backend() != 'gpu',
    )


def causal_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, implementation: str):
    """Causal softmax attention scaled by 1/sqrt(H); K may divide N (grouped-query).

    Query head n reads kv head n // (N/K), LLaMA's repeat-interleave order (as
    jax.nn.dot_product_attention groups them). Under context parallelism (a step traced
    with context_parallel.attention_across) the sequences are split along T over the
    context axis, and context_parallel.py crosses it.
    """
    split = context_parallel.active()
    if split is not None:
        one_device = lambda q, k, v: _one_device_attention(q, k, v, implementation)
        return context_parallel.attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, split, one_device)
    return _one_device_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, implementation)


def _one_device_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, implementation: str):
    if implementation == 'pallas':
        group = q_BxTxNxH.shape[2] // k_BxTxKxH.shape[2]
        # The Pallas kernel wants one kv head per query head.
        k_BxTxNxH = jnp.repeat(k_BxTxKxH, group, axis=2)
        v_BxTxNxH = jnp.repeat(v_BxTxKxH, group, axis=2)
        return _pallas_attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH)
    index = _CALL_INDEX.get() if implementation == 'cudnn' and q_BxTxNxH.dtype == jnp.bfloat16 else None
    q_BxTxNxH, scale = scaled_queries(q_BxTxNxH, index)
    return jax.nn.dot_product_attention(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, scale=scale, is_causal=True, implementation=implementation
    )
