"""The stacked blocks of either model family: creating them, and applying them scanned or
unrolled.

Axis letters: B batch, T time, C channels, V vocab.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain.models import attention
from jaxtrain.models.recompute import OFF, Recompute
from jaxtrain.models.recompute import segments as recompute_segments


def stack_blocks(num_layers: int, make_block, rngs: nnx.Rngs) -> nnx.Module:
    """num_layers blocks from make_block(rngs), as one module whose parameters carry a
    leading layer axis (llm.c's file layout, and what apply_blocks runs)."""

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
        return make_block(rngs)

    return stacked(rngs)


def apply_blocks(
    stacked_blocks: nnx.Module,
    x_BxTxC,
    *extra,
    scan: bool = True,
    distinct_attention: bool = False,
    recompute: Recompute = OFF,
):
    """Runs the L stacked blocks in order.

    scan=True compiles one block and loops: fast compile, but XLA copies every saved
    activation into the stacked loop buffers (about 14 ms of a 49 ms GPT-2 124M step on an
    H200). scan=False unrolls the L layers: longer compile, faster steps. With
    distinct_attention (deterministic runs) each unrolled layer's attention call is made
    distinct (attention.distinct_calls), which deterministic cuDNN attention needs on jax
    0.11.2; fast runs skip its query scaling, which cost LLaMA-3 1B's step 2-3%.
    recompute: which groups of layers are jax.checkpoint regions (models/recompute.py).
    """
    block_def, block_params = nnx.split(stacked_blocks)
    num_layers = jax.tree.leaves(block_params)[0].shape[0]
    policy = recompute.policy()

    def region(fn, recomputed):
        return jax.checkpoint(fn, policy=policy) if recomputed else fn

    if scan:

        def apply_block(x_BxTxC, layer_params):
            return nnx.merge(block_def, layer_params)(x_BxTxC, *extra), None

        for start, end, size, recomputed in recompute_segments(num_layers, recompute):
            part = jax.tree.map(lambda p, a=start, b=end: p[a:b], block_params)
            if size == end - start and not recomputed:
                x_BxTxC, _ = jax.lax.scan(apply_block, x_BxTxC, part)
                continue
            # groups of `size` layers: an outer scan over groups, each group one region
            groups = jax.tree.map(lambda p, n=size: p.reshape((-1, n) + p.shape[1:]), part)

            def apply_group(x_BxTxC, group_params):
                return jax.lax.scan(apply_block, x_BxTxC, group_params)[0], None

            x_BxTxC, _ = jax.lax.scan(region(apply_group, recomputed), x_BxTxC, groups)
        return x_BxTxC
    # One split of each stacked tensor, not L index ops: the gradient of `p[layer]` is a pad
    # of zeros per layer, summed, which XLA fuses into every consumer of the stacked gradient
    # (the norm, AdamW, the finite check); the gradient of a split is one concatenation.
    # The sums add only zeros, so both give the same gradients bit for bit.
    per_leaf = jax.tree.map(lambda p: jnp.split(p, num_layers, axis=0), block_params)

    def layer_params(layer):
        return jax.tree.map(lambda parts: parts[layer][0], per_leaf, is_leaf=lambda t: isinstance(t, list))

    def apply_layers(x_BxTxC, params, first):
        for offset, one in enumerate(params):
            layer = first + offset
            with attention.distinct_calls(layer if distinct_attention else None):
                x_BxTxC = nnx.merge(block_def, one)(x_BxTxC, *extra)
        return x_BxTxC

    for start, end, size, recomputed in recompute_segments(num_layers, recompute):
        for first in range(start, end, size):
            params = [layer_params(layer) for layer in range(first, first + size)]
            fn = region(lambda x, p, first=first: apply_layers(x, p, first), recomputed)
            x_BxTxC = fn(x_BxTxC, params)
    return x_BxTxC
