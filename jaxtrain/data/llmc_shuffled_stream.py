"""The train stream in llm.c's permuted order (`--shuffle llmc`), still a pure function of the position.

One llm.c batch ("sample") is a micro-step's tokens: rows_per_micro_step x seq_len (+1 target).
Step `position` reads samples position*A .. position*A + A - 1 of llm.c's sequence (A = gradient
accumulation), which may cross shard and epoch boundaries as llm.c's micro-steps do. Which shard
and sample the k-th one is comes from llmc_io.llmc_shuffle, replaying dataloader.h's mt19937 from
its seed: the saved position alone makes a resume exact, and the llm.c loader state at any position
(for an llm.c state file, or to check one) is recomputed from it.
"""

from __future__ import annotations

import numpy as np

from jaxtrain.data.stream import DataError, TokenStream
from llmc_io.llmc_shuffle import LLMCOrder


class LLMCShuffledStream(TokenStream):
    """TokenStream whose window(position) reads llm.c's permuted samples (see the module docstring)."""

    def __init__(self, pattern, tokens_per_step, seq_len, vocab_size, accumulation: int, **kwargs):
        super().__init__(pattern, tokens_per_step, seq_len, vocab_size, **kwargs)
        if tokens_per_step % accumulation:
            raise DataError(
                f'{self.name} data: tokens_per_step {tokens_per_step}: expected a multiple of the '
                f'gradient accumulation {accumulation}'
            )
        self.accumulation = accumulation
        self.sample_tokens = tokens_per_step // accumulation
        # dataloader.h: shard_num_samples = (ntok - 1) // (B*T*num_processes), every one read.
        self.samples_per_shard = [(len(t) - 1) // self.sample_tokens for t in self.shards]
        self.order = LLMCOrder(self.samples_per_shard)

    def epoch_of(self, position: int) -> int:
        return self._check_position(position) * self.accumulation // self.order.samples_per_epoch

    def samples_of(self, position: int) -> list[tuple[int, int]]:
        """[(shard file index, sample index)] of the micro-steps of window `position`."""
        first = self._check_position(position) * self.accumulation
        return [self.order.sample(k) for k in range(first, first + self.accumulation)]

    def window(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        inputs, targets = [], []
        for shard, sample in self.samples_of(position):
            tokens = self.tokens_at(shard, sample * self.sample_tokens, self.sample_tokens + 1)
            inputs.append(tokens[:-1])
            targets.append(tokens[1:])
        rows = (self.rows, self.seq_len)
        return np.concatenate(inputs).reshape(rows), np.concatenate(targets).reshape(rows)

    def loader_state(self, position: int):
        """llm.c's (current_shard_idx, current_sample_idx, ShuffleState) after window `position`."""
        return self.order.loader_state_after(self._check_position(position) * self.accumulation)

    def describe(self) -> str:
        return (
            super().describe() + f", llm.c's shuffled order ({sum(self.samples_per_shard):,} samples/epoch)"
        )
