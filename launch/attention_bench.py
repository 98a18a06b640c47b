"""Times causal attention forward + backward at GPT-2 124M's shape: cuDNN against JAX's Pallas
(Triton) flash attention at several block sizes and warp counts (GPU only; BENCHMARKS.md,
round four). Deterministic runs take the Pallas kernel (models/attention.py).

  python launch/attention_bench.py [B=16] [T=1024] [N=12] [H=64]

Each variant is jitted alone, warmed up, and timed as the median of 20 blocked calls of one
layer's forward and backward; prints ms per layer and per 12 layers.
"""

import functools
import math
import warnings

import jax
import jax.numpy as jnp

with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import attention as pallas_mha

from kernel_timing import integer_args, median_ms  # launch/, beside this script

# (block_q, block_k, block_q_dkv, block_kv_dkv = block_q_dq, block_kv_dq, num_warps, num_stages);
# the kernel's backward grid runs over kv blocks, so its dq blocks are the dkv kv blocks.
VARIANTS = (
    (64, 64, 64, 64, 64, None, 2),  # models/attention.py in round three
    (64, 64, 64, 64, 64, 8, 2),
    (128, 64, 64, 64, 64, None, 2),
    (128, 128, 64, 64, 64, None, 2),
    (64, 64, 64, 64, 64, None, 3),
    (64, 64, 32, 64, 64, None, 2),
    (64, 64, 64, 128, 64, None, 2),
    (64, 64, 128, 128, 64, None, 2),
    (64, 64, 64, 128, 128, None, 2),  # models/attention.py since round four
    (128, 64, 64, 128, 128, None, 2),
    (128, 128, 64, 128, 128, None, 2),
    (64, 64, 128, 128, 128, None, 2),
    (64, 64, 128, 128, 128, 8, 2),
)


def _forward_backward(attention):
    def loss(q, k, v, do):
        return jnp.sum(attention(q, k, v).astype(jnp.float32) * do)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main(B: int = 16, T: int = 1024, N: int = 12, H: int = 64) -> None:
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(key, (B, T, N, H), jnp.bfloat16) for key in keys)
    cudnn = functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation='cudnn')
    ms = median_ms(_forward_backward(cudnn), q, k, v, do)
    print(f'{"cudnn":44s} {ms:6.3f} ms/layer {12 * ms:6.2f} ms/12 layers', flush=True)
    for bq, bk, bq_dkv, bkv_dkv, bkv_dq, warps, stages in VARIANTS:
        sizes = pallas_mha.BlockSizes(
            block_q=bq, block_k=bk, block_q_dkv=bq_dkv, block_kv_dkv=bkv_dkv, block_q_dq=bkv_dkv, block_kv_dq=bkv_dq
        )
        attention = functools.partial(
            pallas_mha.mha,
            segment_ids=None,
            sm_scale=1 / math.sqrt(H),
            causal=True,
            block_sizes=sizes,
            num_warps=warps,
            num_stages=stages,
        )
        name = f'pallas {bq}/{bk} bwd {bq_dkv}/{bkv_dkv}/{bkv_dq} warps {warps} stages {stages}'
        try:
            ms = median_ms(_forward_backward(attention), q, k, v, do)
            print(f'{name:44s} {ms:6.3f} ms/layer {12 * ms:6.2f} ms/12 layers', flush=True)
        except Exception as error:  # a shape Triton refuses: say so and go on
            print(f'{name:44s} failed: {type(error).__name__}: {str(error)[:160]}', flush=True)


if __name__ == '__main__':
    main(*integer_args(__doc__, 4))
