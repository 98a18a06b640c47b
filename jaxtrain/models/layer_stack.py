"""The stacked blocks of either model family: creating them, and applying them scanned or
unrolled.

Axis letters: B batch, T time, C channels, V vocab.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain.models import attention


def stack_blocks(num_layers: int, make_block, rngs: nnx.Rngs) -> nnx.Module:
    """num_layers blocks from make_block(rngs), as one module whose parameters carry a
    leading layer axis (llm.c's file layout, and what apply_blocks runs)."""

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
        return make_block(rngs)

    return stacked(rngs)


def apply_blocks(
    stacked_blocks: nnx.Module, x_BxTxC, *extra, scan: bool = True, distinct_attention: bool = False
):
    """Runs the L stacked blocks in order.

    scan=True compiles one block and loops: fast compile, but XLA copies every saved
    activation into the stacked loop buffers (about 14 ms of a 49 ms GPT-2 124M step on an
    H200). scan=False unrolls the L layers: longer compile, faster steps. With
    distinct_attention (deterministic runs) each unrolled layer's attention call is made
    distinct (attention.distinct_calls), which deterministic cuDNN attention needs on jax
    0.11.2; fast runs skip its query scaling, which cost LLaMA-3 1B's step 2-3%.
    """
    block_def, block_params = nnx.split(stacked_blocks)
    if scan:

        def apply_block(x_BxTxC, layer_params):
            return nnx.merge(block_def, layer_params)(x_BxTxC, *extra), None

        x_BxTxC, _ = jax.lax.scan(apply_block, x_BxTxC, block_params)
        return x_BxTxC
    # One split of each stacked tensor, not L index ops: the gradient of `p[layer]` is a pad
    # of zeros per layer, summed, which XLA fuses into every consumer of the stacked gradient
    # (the norm, AdamW, the finite check); the gradient of a split is one concatenation.
    # The sums add only zeros, so both give the same gradients bit for bit.
    num_layers = jax.tree.leaves(block_params)[0].shape[0]
    per_leaf = jax.tree.map(lambda p: jnp.split(p, num_layers, axis=0), block_params)
    for layer in range(num_layers):
        layer_params = jax.tree.map(lambda parts: parts[layer][0], per_leaf, is_leaf=lambda t: isinstance(t, list))
        with attention.distinct_calls(layer if distinct_attention else None):
            x_BxTxC = nnx.merge(block_def, layer_params)(x_BxTxC, *extra)
    return x_BxTxC
