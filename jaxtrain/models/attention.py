"""Causal self-attention shared by GPT-2 and LLaMA-3, and the choice of kernel.

Axis letters: B batch, T time, N query heads, K key/value heads, H head dim.
"""

import jax
import jax.numpy as jnp


def resolve_attention(requested: str, compute_dtype) -> str:
    """Picks the attention kernel for `requested` in {'auto', 'xla', 'cudnn'}.

    cuDNN flash attention only exists on NVIDIA GPUs and only for bf16/fp16, so 'auto'
    takes it exactly there and XLA's reference attention everywhere else (CPU, fp32).
    """
    if requested not in ('auto', 'xla', 'cudnn'):
        raise ValueError(f"attention: expected one of auto, xla, cudnn; found {requested!r}")
    half = jnp.dtype(compute_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    on_gpu = jax.default_backend() == 'gpu'
    if requested == 'auto':
        return 'cudnn' if (on_gpu and half) else 'xla'
    if requested == 'cudnn' and not (on_gpu and half):
        raise ValueError(
            'attention: cudnn needs a GPU and dtype bfloat16; found backend '
            f"{jax.default_backend()!r} and dtype {jnp.dtype(compute_dtype).name}. Use attention='xla'."
        )
    return requested


def causal_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, implementation: str):
    """Causal softmax attention scaled by 1/sqrt(H); K may divide N (grouped-query).

    jax.nn.dot_product_attention groups query head n with kv head n // (N/K), which is
    LLaMA's repeat-interleave order.
    """
    return jax.nn.dot_product_attention(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, is_causal=True, implementation=implementation
    )
