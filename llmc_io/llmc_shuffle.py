"""llm.c's permuted train-loader order, replayed: which shard and sample its k-th batch reads.

After karpathy/llm.c f1e2ace6 llmc/dataloader.h (dataloader_init / dataloader_reset /
dataloader_advance_ / prepare_intra_shard_indices_) and llmc/rand.h (mt19937 seeded like
torch.manual_seed, random_permutation = Fisher-Yates drawing randint32() % (i + 1) from the top):
  - the rng is seeded with 42 + process_rank once, in dataloader_init;
  - every epoch (dataloader_reset) permutes shard_indices in place: the previous epoch's order,
    not the identity, is what gets permuted;
  - every shard the epoch reaches gets a fresh permutation of identity(shard_num_samples);
  - a shard of ntok tokens holds (ntok - 1) // (B*T*num_processes) samples, all of them read.
`loader_state_after(k)` is what llm.c's loader holds after k batches: the fields save_state writes.

The mt19937 words are Python's own random module (the same generator and tempering); only its
state is moved in and out of llm.c's struct (left_ draws remain before regeneration).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from llmc_io.llmc_state import MT_N, MTState, ShuffleState

LLMC_SHUFFLE_SEED = 42  # dataloader_init: manual_seed(&shuffle_rng, 42 + process_rank)


def _seeded_words(seed: int) -> np.ndarray:
    words = np.zeros(MT_N, np.uint64)
    words[0] = seed & 0xFFFFFFFF
    for j in range(1, MT_N):
        prev = int(words[j - 1])
        words[j] = (1812433253 * (prev ^ (prev >> 30)) + j) & 0xFFFFFFFF
    return words.astype(np.uint32)


class MT19937:
    """llm.c's mt19937_state as a generator: manual_seed, randint32, and the struct's fields."""

    def __init__(self, seed: int | None = None, state: MTState | None = None):
        self._py = random.Random()
        if state is None:
            state = MTState(left=1, next=0, words=_seeded_words(seed))
        self.set_state(state)

    def set_state(self, state: MTState) -> None:
        # Python's index mti counts words used in the block; llm.c's left_ counts down to the
        # regeneration: mti = 625 - left_ (left_ = 1: the next draw regenerates, as mti = 624).
        words = tuple(int(w) for w in state.words)
        self._py.setstate((3, words + (625 - state.left,), None))
        self._fresh_next = state.next if state.left == 1 else None

    def state(self) -> MTState:
        internal = self._py.getstate()[1]
        mti = internal[-1]
        left = 625 - mti
        # Right after manual_seed next_ is 0 with left_ 1; after a whole block it is 624.
        nxt = self._fresh_next if self._fresh_next is not None else mti
        return MTState(left=left, next=nxt, words=np.array(internal[:-1], np.uint32))

    def randint32(self) -> int:
        self._fresh_next = None
        return self._py.getrandbits(32)

    def permute(self, data: np.ndarray) -> None:
        """random_permutation: in place, i from the top down, j = randint32() % (i + 1)."""
        draw = self._py.getrandbits
        if len(data) > 1:
            self._fresh_next = None
        values = data.tolist()
        for i in range(len(values) - 1, 0, -1):
            j = draw(32) % (i + 1)
            values[i], values[j] = values[j], values[i]
        data[:] = values


@dataclasses.dataclass
class _Epoch:
    shard_order: np.ndarray  # shard_indices of the epoch (file indices into the sorted glob)
    rng_at_start: MTState  # before this epoch's shard permutation


class LLMCOrder:
    """The (shard, sample) of llm.c's k-th train batch for shards of `samples_per_shard` samples."""

    def __init__(self, samples_per_shard: list[int], seed: int = LLMC_SHUFFLE_SEED):
        self.samples_per_shard = [int(n) for n in samples_per_shard]
        self.samples_per_epoch = sum(self.samples_per_shard)
        self.seed = seed
        self._epochs: list[_Epoch] = []
        self._intra_cache: dict[tuple[int, int], tuple[np.ndarray, MTState]] = {}
        rng = MT19937(seed)
        self._next_epoch_start = (np.arange(len(self.samples_per_shard), dtype=np.int32), rng.state())

    def _epoch(self, e: int) -> _Epoch:
        while len(self._epochs) <= e:
            previous_order, rng_state = self._next_epoch_start
            rng = MT19937(state=rng_state)
            order = previous_order.copy()
            rng.permute(order)
            for n in (self.samples_per_shard[int(s)] for s in order):
                rng.permute(np.arange(n, dtype=np.int32))  # the epoch's intra-shard draws
            self._epochs.append(_Epoch(order, rng_state))
            self._next_epoch_start = (order, rng.state())
        return self._epochs[e]

    def _intra(self, e: int, i: int) -> tuple[np.ndarray, MTState]:
        """(intra_shard_indices, rng state after drawing them) of position i of epoch e."""
        key = (e, i)
        if key not in self._intra_cache:
            if len(self._intra_cache) > 256:  # a run moves forward; recomputing an old one is cheap
                self._intra_cache.clear()
            epoch = self._epoch(e)
            rng = MT19937(state=epoch.rng_at_start)
            rng.permute(epoch.shard_order.copy())
            for pos, s in enumerate(epoch.shard_order[: i + 1]):
                perm = np.arange(self.samples_per_shard[int(s)], dtype=np.int32)
                rng.permute(perm)
                self._intra_cache[(e, pos)] = (perm, rng.state())
        return self._intra_cache[key]

    def locate(self, k: int) -> tuple[int, int, int]:
        """(epoch, position of the shard in the epoch's order, position of the sample in the shard)."""
        e, in_epoch = divmod(int(k), self.samples_per_epoch)
        order = self._epoch(e).shard_order
        for i, s in enumerate(order):
            n = self.samples_per_shard[int(s)]
            if in_epoch < n:
                return e, i, in_epoch
            in_epoch -= n
        raise AssertionError('unreachable: in_epoch < samples_per_epoch')

    def sample(self, k: int) -> tuple[int, int]:
        """(shard file index, sample index within it) of llm.c's k-th batch (from 0)."""
        e, i, j = self.locate(k)
        intra, _ = self._intra(e, i)
        return int(self._epoch(e).shard_order[i]), int(intra[j])

    def loader_state_after(self, k: int) -> tuple[int, int, ShuffleState]:
        """(current_shard_idx, current_sample_idx, shuffle state) of llm.c's loader after k batches."""
        if k == 0:
            e, i, done = 0, 0, 0
        else:
            e, i, j = self.locate(k - 1)
            done = j + 1  # llm.c moves to the next shard only when the next batch is asked for
        intra, rng = self._intra(e, i)
        return i, done, ShuffleState(self._epoch(e).shard_order.copy(), intra.copy(), rng)
