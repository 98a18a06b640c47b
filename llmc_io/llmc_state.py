"""llm.c's optimizer-state file, `state_%08d_%05d.bin`, read and written.

Layout (karpathy/llm.c f1e2ace6, train_gpt2.cu save_state / load_state, lines 1209-1313):
  int32[256] header:  [0] 20240527 magic  [1] 1 version  [2] num_processes  [3] process_rank
                      [4] use_master_weights  [5] should_shuffle  [10] step
                      [20:22] u64 rng_state  [22:24] u64 rng_state_last_update (stochastic rounding)
                      [30:32] u64 current_shard_idx  [32:34] u64 current_sample_idx (the train loader)
  fp32[N] AdamW m, fp32[N] AdamW v, fp32[N] master weights when [4] == 1
      (N = the model's parameter count with vocabulary padding, in the model file's tensor order;
      a ZeRO-1 rank would hold N / num_processes, which this reader does not take)
  when [5] == 1, the permuted loader (llmc/dataloader.h):
      u64 num_shards, int32[num_shards] shard_indices,
      u64 shard_num_samples, int32[shard_num_samples] intra_shard_indices,
      mt19937_state (llmc/rand.h): u64 seed_, int32 left_, u32 next_, u32 state_[624], u32 MATRIX_A[2]
The mt19937 struct's seed_ is never set by manual_seed (dataloader_init copies a stack struct), so
its 8 bytes are whatever was on the stack: kept as read, never compared. LLMCOrder, at the end,
replays the permuted loader whose state these fields hold.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np

from llmc_io import header as hdr
from llmc_io.atomic_file import atomic_output, write_array
from llmc_io.errors import LLMCFormatError
from llmc_io.tensors import file_to_tree, tree_arrays_for_writing, tree_set, tree_to_file

STATE_MAGIC = 20240527
STATE_VERSION = 1
MT_N = 624
# mt19937_state as the C compiler lays it out on x86-64 / aarch64: 8 + 4 + 4 + 624*4 + 2*4 bytes.
MT_STATE_DTYPE = np.dtype(
    [('seed', '<u8'), ('left', '<i4'), ('next', '<u4'), ('state', '<u4', (MT_N,)), ('matrix_a', '<u4', (2,))]
)
MATRIX_A = (0x0, 0x9908B0DF)


@dataclasses.dataclass
class MTState:
    """llm.c's mt19937_state: 624 words, `left` draws before the next regeneration, `next` the index."""

    left: int
    next: int
    words: np.ndarray  # uint32[624]
    matrix_a: tuple = MATRIX_A
    seed_bytes: int = 0  # the uninitialised seed_ field, as read (see the module docstring)

    def same_as(self, other: MTState) -> bool:
        return (
            self.left == other.left
            and self.next == other.next
            and tuple(self.matrix_a) == tuple(other.matrix_a)
            and np.array_equal(self.words, other.words)
        )


@dataclasses.dataclass
class ShuffleState:
    """The permuted train loader's state: shard order of the epoch, sample order of the current shard."""

    shard_indices: np.ndarray  # int32[num_shards]
    intra_shard_indices: np.ndarray  # int32[shard_num_samples]
    rng: MTState


@dataclasses.dataclass
class LLMCState:
    step: int
    num_processes: int = 1
    process_rank: int = 0
    rng_state: int = 13371337  # train_gpt2.cu gpt2_init_common's seed for stochastic rounding
    rng_state_last_update: int = 13371337
    current_shard_idx: int = 0
    current_sample_idx: int = 0
    m: np.ndarray | None = None  # fp32[N]
    v: np.ndarray | None = None
    master: np.ndarray | None = None  # fp32[N] or None (written with -w 0)
    shuffle: ShuffleState | None = None  # None: the loader did not shuffle (-a 1 / overfit_single_batch)
    version: int = STATE_VERSION

    @property
    def use_master_weights(self) -> bool:
        return self.master is not None


def _u64(ints: np.ndarray, slot: int) -> int:
    return int(ints[slot : slot + 2].view('<u8')[0])


def read_state(path: str | os.PathLike, num_parameters: int) -> LLMCState:
    """Read a state file for a model of `num_parameters` (padded) values; every field is checked
    against the file's size before any array is read."""
    path = os.fspath(path)
    size = hdr.file_size(path)
    if size < hdr.HEADER_BYTES:
        raise LLMCFormatError(path, 'size', f'at least the {hdr.HEADER_BYTES}-byte header', f'{size} bytes')
    ints = np.fromfile(path, dtype='<i4', count=hdr.HEADER_INTS)
    if int(ints[0]) != STATE_MAGIC:
        raise LLMCFormatError(
            path,
            'header[0] magic',
            f'{STATE_MAGIC} (llm.c state file)',
            hdr.describe_magic(int(ints[0])),
            'pass the state_%08d_%05d.bin that train_gpt2cu wrote',
        )
    if int(ints[1]) != STATE_VERSION:
        raise LLMCFormatError(
            path,
            'header[1] version',
            f'{STATE_VERSION} (the only one llm.c f1e2ace6 writes)',
            int(ints[1]),
            'this state file is from another llm.c version; resume it with the trainer that wrote it',
        )
    num_processes, rank = int(ints[2]), int(ints[3])
    if num_processes != 1 or rank != 0:
        raise LLMCFormatError(
            path,
            'header[2] num_processes / header[3] process_rank',
            '1 / 0 (a one-process llm.c run)',
            f'{num_processes} / {rank}',
            'a multi-process run keeps per-rank loader state (and ZeRO shards); resume it with llm.c',
        )
    master_flag, shuffle_flag = int(ints[4]), int(ints[5])
    for slot, value in ((4, master_flag), (5, shuffle_flag)):
        if value not in (0, 1):
            raise LLMCFormatError(path, f'header[{slot}]', '0 or 1', value)
    arrays = 3 if master_flag else 2
    offset = hdr.HEADER_BYTES + arrays * 4 * num_parameters
    if size < offset or (not shuffle_flag and size != offset):
        if size < offset:
            why = f'{offset - size:,} bytes short: the file is truncated, or belongs to a larger model'
        else:
            why = (
                f'{size - offset:,} bytes more than the header accounts for: bytes were added after its '
                'end, or the file belongs to a smaller model'
            )
        raise LLMCFormatError(
            path,
            'size',
            f'{offset} bytes (header + {arrays} x {num_parameters:,} fp32: m, v'
            f"{', master weights' if master_flag else ''}){' + loader state' if shuffle_flag else ''}",
            f'{size} bytes',
            why,
        )
    data = np.memmap(path, dtype='<f4', mode='r', offset=hdr.HEADER_BYTES, shape=(arrays * num_parameters,))
    state = LLMCState(
        step=int(ints[10]),
        num_processes=num_processes,
        process_rank=rank,
        rng_state=_u64(ints, 20),
        rng_state_last_update=_u64(ints, 22),
        current_shard_idx=_u64(ints, 30),
        current_sample_idx=_u64(ints, 32),
        m=data[:num_parameters],
        v=data[num_parameters : 2 * num_parameters],
        master=data[2 * num_parameters :] if master_flag else None,
    )
    if shuffle_flag:
        state.shuffle = _read_shuffle(path, offset, size)
    return state


def state_value_problems(state: LLMCState) -> list[tuple[str, str, str]]:
    """(field, expected, found) for each damaged array of a state: non-finite m, v or master
    weights, a negative v (a second moment); [] when there is none. One pass over each array."""
    problems = []
    arrays = {'m': state.m, 'v': state.v}
    if state.master is not None:
        arrays['master weights'] = state.master
    for name, array in arrays.items():
        finite = np.isfinite(array)
        if not finite.all():
            first = int(np.argmin(finite))
            bad = finite.size - int(np.count_nonzero(finite))
            found = f'{bad:,} non-finite (the first at value {first:,}: {float(array[first])})'
            problems.append((name, 'finite values', found))
    if np.any(np.asarray(state.v) < 0):
        problems.append(('v', '>= 0 (a second moment)', 'negative values'))
    return problems


def check_state_values(path, state: LLMCState) -> None:
    """Refuses a state whose values are damaged (state_value_problems) before a run starts from
    it: a NaN there would otherwise show as a divergence at the first step."""
    problems = state_value_problems(state)
    if problems:
        raise LLMCFormatError(
            os.fspath(path),
            *problems[0],
            'the state file is damaged; resume an earlier step (python -m jaxtrain.ckpt verify checks one)',
        )


def _read_shuffle(path: str, offset: int, size: int) -> ShuffleState:
    with open(path, 'rb') as f:
        f.seek(offset)
        rest = f.read()
    at = 0

    def take(dtype, count, what):
        nonlocal at
        need = np.dtype(dtype).itemsize * count
        if at + need > len(rest):
            raise LLMCFormatError(
                path,
                f'loader state: {what}',
                f'{need} more bytes at offset {offset + at}',
                f'{len(rest) - at}',
                'the file is truncated',
            )
        out = np.frombuffer(rest, dtype=dtype, count=count, offset=at)
        at += need
        return out

    num_shards = int(take('<u8', 1, 'num_shards')[0])
    shard_indices = take('<i4', num_shards, 'shard_indices').copy()
    num_samples = int(take('<u8', 1, 'shard_num_samples')[0])
    intra = take('<i4', num_samples, 'intra_shard_indices').copy()
    mt = take(MT_STATE_DTYPE, 1, 'mt19937 state')[0]
    if at != len(rest):
        raise LLMCFormatError(
            path,
            'size',
            f'{offset + at} bytes',
            f'{size} bytes',
            f'{len(rest) - at:,} bytes more than the header and the loader state account for: bytes were '
            'added after its end',
        )
    rng = MTState(
        left=int(mt['left']),
        next=int(mt['next']),
        words=np.array(mt['state'], np.uint32),
        matrix_a=tuple(int(x) for x in mt['matrix_a']),
        seed_bytes=int(mt['seed']),
    )
    return ShuffleState(shard_indices, intra, rng)


def write_state(path: str | os.PathLike, state: LLMCState) -> None:
    """Write `state` as train_gpt2.cu save_state does, atomically (complete file or none)."""
    ints = np.zeros(hdr.HEADER_INTS, '<i4')
    ints[:6] = [
        STATE_MAGIC,
        state.version,
        state.num_processes,
        state.process_rank,
        int(state.master is not None),
        int(state.shuffle is not None),
    ]
    ints[10] = state.step
    for slot, value in (
        (20, state.rng_state),
        (22, state.rng_state_last_update),
        (30, state.current_shard_idx),
        (32, state.current_sample_idx),
    ):
        ints[slot : slot + 2] = np.array([value], '<u8').view('<i4')
    with atomic_output(path) as f:
        f.write(ints.tobytes())
        for array in (state.m, state.v) + ((state.master,) if state.master is not None else ()):
            write_array(f, np.asarray(array, '<f4'))
        if state.shuffle is not None:
            s = state.shuffle
            f.write(np.array([len(s.shard_indices)], '<u8').tobytes())
            f.write(np.asarray(s.shard_indices, '<i4').tobytes())
            f.write(np.array([len(s.intra_shard_indices)], '<u8').tobytes())
            f.write(np.asarray(s.intra_shard_indices, '<i4').tobytes())
            mt = np.zeros(1, MT_STATE_DTYPE)
            mt['seed'], mt['left'], mt['next'] = s.rng.seed_bytes, s.rng.left, s.rng.next
            mt['state'][0], mt['matrix_a'][0] = s.rng.words, s.rng.matrix_a
            f.write(mt.tobytes())


# ---- flat optimizer vectors <-> parameter trees --------------------------------------------------


def flat_to_tree(flat: np.ndarray, header) -> dict:
    """A flat fp32 vector in the model file's tensor order (m, v or master weights) as a params tree."""
    tree: dict = {}
    start = 0
    for spec in header.tensor_specs():
        part = np.asarray(flat[start : start + spec.size]).reshape(spec.shape)
        start += spec.size
        tree_set(tree, spec.tree_path, file_to_tree(part, spec.tree_path))
    return tree


def tree_to_flat(path, tree, header) -> np.ndarray:
    """The inverse of flat_to_tree: a params-shaped tree (a moment, or the weights) as llm.c's vector.
    Vocabulary padding rows V..Vp-1 are written as zeros, as llm.c never updates them."""
    arrays = tree_arrays_for_writing(path, tree, header.param_shapes())
    parts = []
    for spec in header.tensor_specs():
        array = tree_to_file(arrays[spec.tree_path], spec.tree_path)
        if spec.name == 'wte':
            array = array.copy()
            array[header.vocab_size :] = 0.0
        parts.append(np.ascontiguousarray(array, np.float32).ravel())
    return np.concatenate(parts)


def state_path(run_dir, step: int, rank: int = 0) -> Path:
    return Path(run_dir) / f'state_{step:08d}_{rank:05d}.bin'


# --- the permuted loader, replayed ------------------------------------------------------------------
# llm.c's permuted train-loader order, replayed: which shard and sample its k-th batch reads.
#
# After karpathy/llm.c f1e2ace6 llmc/dataloader.h (dataloader_init / dataloader_reset /
# dataloader_advance_ / prepare_intra_shard_indices_) and llmc/rand.h (mt19937 seeded like
# torch.manual_seed, random_permutation = Fisher-Yates drawing randint32() % (i + 1) from the top):
#   - the rng is seeded with 42 + process_rank once, in dataloader_init;
#   - every epoch (dataloader_reset) permutes shard_indices in place: the previous epoch's order,
#     not the identity, is what gets permuted;
#   - every shard the epoch reaches gets a fresh permutation of identity(shard_num_samples);
#   - a shard of ntok tokens holds (ntok - 1) // (B*T*num_processes) samples, all of them read.
# `loader_state_after(k)` is what llm.c's loader holds after k batches: the fields save_state writes.
#
# The mt19937 words are Python's own random module (the same generator and tempering); only its
# state is moved in and out of llm.c's struct (left_ draws remain before regeneration).

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
