"""The stacked blocks of either model family: creating them, and applying them scanned or
unrolled, with activation recompute over groups of layers as InfiniTrain's PR 154 flags
choose them.

Axis letters: B batch, T time, C channels, V vocab.

Recompute:

Upstream (InfiniTensor/InfiniTrain branch feat/activation_checkpointing, e594d9c,
infini_train/src/nn/modules/transformer/transformer.cc TransformerChunk::Forward and
transformer_config.cc SetActivationRecomputeConfig):
  --activation_recompute false            nothing is recomputed (the other flags are ignored)
  --recompute_granularity full            ... and --recompute_method none: every layer is its own region
  --recompute_method uniform N            consecutive groups of N layers, each one region
  --recompute_method block N              the first N layers each a region; the rest store activations
  --recompute_granularity selective       upstream stops with "not implemented yet"; here it is
                                          Megatron's selective recompute: every layer keeps its weight
                                          matmuls' outputs and recomputes the rest (attention scores,
                                          softmax, norms, activations)
uniform and block need --recompute_num_layers >= 1 (upstream CHECKs it). A region is one jax.checkpoint:
only its input is kept for the backward pass, everything inside is recomputed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain.models import attention

GRANULARITIES = ('none', 'full', 'selective')
METHODS = ('none', 'uniform', 'block')


@dataclasses.dataclass(frozen=True)
class Recompute:
    granularity: str = 'none'
    method: str = 'none'
    num_layers: int = 0

    @classmethod
    def from_config(cls, config) -> Recompute:
        """SetActivationRecomputeConfig: off unless activation_recompute; selective ignores the method."""
        if not config.activation_recompute or config.recompute_granularity == 'none':
            return cls()
        if config.recompute_granularity == 'selective' or config.recompute_method == 'none':
            return cls(config.recompute_granularity)
        return cls('full', config.recompute_method, int(config.recompute_num_layers))

    @property
    def enabled(self) -> bool:
        return self.granularity != 'none'

    def policy(self):
        """What a region keeps: nothing (full), or the weight matmuls' outputs (selective)."""
        if self.granularity == 'selective':
            return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        return None


OFF = Recompute()  # no region: every activation the backward pass needs is stored


def check(config) -> list[str]:
    """Problems with the recompute keys, one line each (checks/config_checks.py joins them)."""
    problems = []
    if config.recompute_granularity not in GRANULARITIES:
        problems.append(
            f'recompute_granularity: expected none, full or selective, found {config.recompute_granularity!r}'
        )
    if config.recompute_method not in METHODS:
        problems.append(
            f'recompute_method: expected none, uniform or block, found {config.recompute_method!r}'
        )
    elif (
        config.activation_recompute
        and config.recompute_granularity == 'full'
        and config.recompute_method != 'none'
        and config.recompute_num_layers < 1
    ):
        problems.append(
            f'recompute_num_layers: expected 1 or more with --recompute_method {config.recompute_method}, '
            f'found {config.recompute_num_layers}; pass --recompute_num_layers N'
        )
    return problems


def segments(num_layers: int, plan: Recompute) -> list[tuple[int, int, int, bool]]:
    """[(start, end, group size, recomputed)]: layers [start, end) in groups of that size, in order."""
    if not plan.enabled:
        return [(0, num_layers, num_layers, False)]
    if plan.granularity == 'selective' or plan.method == 'none':
        return [(0, num_layers, 1, True)]
    n = min(plan.num_layers, num_layers)
    if plan.method == 'uniform':
        whole = num_layers - num_layers % n
        out = [(0, whole, n, True)]
        if whole < num_layers:
            out.append((whole, num_layers, num_layers - whole, True))
        return out
    out = [(0, n, 1, True)]  # block
    if n < num_layers:
        out.append((n, num_layers, num_layers - n, False))
    return out


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
    recompute: which groups of layers are jax.checkpoint regions (Recompute, above).
    """
    block_def, block_params = nnx.split(stacked_blocks)
    num_layers = jax.tree.leaves(block_params)[0].shape[0]
    policy = recompute.policy()

    def region(fn, recomputed):
        return jax.checkpoint(fn, policy=policy) if recomputed else fn

    if scan:

        def apply_block(x_BxTxC, layer_params):
            return nnx.merge(block_def, layer_params)(x_BxTxC, *extra), None

        for start, end, size, recomputed in segments(num_layers, recompute):
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

    for start, end, size, recomputed in segments(num_layers, recompute):
        for first in range(start, end, size):
            params = [layer_params(layer) for layer in range(first, first + size)]
            fn = region(lambda x, p, first=first: apply_layers(x, p, first), recomputed)
            x_BxTxC = fn(x_BxTxC, params)
    return x_BxTxC
