"""Times the loss-and-gradient of one chunk of logits: XLA's form against the Pallas kernel,
at several block sizes, warp counts and pipeline stages (GPU only; BENCHMARKS.md, round four).

  python launch/cross_entropy_bench.py [ROWS=8192] [VOCAB=50304]

ROWS x VOCAB bf16 logits (GPT-2 124M at batch 16 x 1024 makes two chunks of 8192 rows), random
targets; each variant is jitted alone, warmed up, and timed as the median of 20 blocked calls.
Prints one line per variant with ms and the effective bandwidth of one read plus one write.
"""

import jax
import jax.numpy as jnp
import numpy as np

from kernel_timing import integer_args, median_ms  # launch/, beside this script
from jaxtrain.models import cross_entropy_kernel, lm_head_loss


def main(rows: int = 8192, vocab: int = 50304) -> None:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((rows, vocab), np.float32) * 3, jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, 50257, rows), jnp.int32)
    moved_gb = 2 * logits.size * logits.dtype.itemsize / 1e9  # read once, write once
    variants = {'xla': lambda x, t: lm_head_loss._xla_loss_and_dlogits(x[None], t[None], 50257, 1e-5, True)}
    shapes = [(2048, 8, 3), (2048, 8, 4), (4096, 8, 3), (2048, 16, 3), (1024, 8, 3), (2048, 8, 1)]
    for block, warps, stages in shapes:
        def kernel(x, t, settings=(block, warps, stages)):
            k = cross_entropy_kernel
            k.BLOCK, k.NUM_WARPS, k.NUM_STAGES = settings
            return k.softmax_cross_entropy(x, t, 50257, 1e-5, True)
        variants[f'pallas block {block} warps {warps} stages {stages}'] = kernel
    reference = None
    for name, fn in variants.items():
        try:
            ms = median_ms(jax.jit(fn), logits, targets)
            loss, grad = jax.jit(fn)(logits, targets)
            total = float(jnp.sum(loss))
            reference = total if reference is None else reference
            print(f'{name:28s} {ms:7.3f} ms  {moved_gb / ms * 1e3:6.0f} GB/s  loss sum {total:.6e}', flush=True)
        except Exception as error:  # a block/warp pair Triton refuses: say so and go on
            print(f'{name:28s} failed: {type(error).__name__}: {str(error)[:160]}', flush=True)


if __name__ == '__main__':
    main(*integer_args(__doc__, 2))
