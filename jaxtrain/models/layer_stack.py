"""Applying the stacked blocks of either model family: scanned or unrolled.

Axis letters: B batch, T time, C channels, V vocab.
"""

import jax
from flax import nnx


def apply_blocks(stacked_blocks: nnx.Module, x_BxTxC, *extra, scan: bool = True):
    """Runs the L stacked blocks in order.

    scan=True compiles one block and loops (fast compile; deterministic cuDNN attention
    on GPU needs it with jax 0.11.2); scan=False unrolls the L layers, which lets XLA
    overlap and fuse across layers (faster steps in non-deterministic mode).
    """
    block_def, block_params = nnx.split(stacked_blocks)
    if scan:

        def apply_block(x_BxTxC, layer_params):
            return nnx.merge(block_def, layer_params)(x_BxTxC, *extra), None

        x_BxTxC, _ = jax.lax.scan(apply_block, x_BxTxC, block_params)
        return x_BxTxC
    num_layers = jax.tree.leaves(block_params)[0].shape[0]
    for layer in range(num_layers):
        layer_params = jax.tree.map(lambda p: p[layer], block_params)
        x_BxTxC = nnx.merge(block_def, layer_params)(x_BxTxC, *extra)
    return x_BxTxC
