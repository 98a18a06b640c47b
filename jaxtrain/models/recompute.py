"""Activation recompute over groups of layers, as InfiniTrain's PR 154 flags choose them.

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
