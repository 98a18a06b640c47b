"""The llm.c token stream, addressed by one saveable integer: the number of windows consumed.

A *window* is the `tokens_per_step + 1` tokens one optimizer step needs: inputs are the first
`tokens_per_step` tokens, targets the same window shifted by one. Window k of a shard starts at token
k * tokens_per_step, so consecutive windows overlap by exactly one token, as in llm.c's DataLoader.
With tokens_per_step = B*T, window b is llm.c's (and InfiniTrain's) unshuffled batch b:
tokens [b*B*T, (b+1)*B*T + 1) (docs/formats.md §3).

Generalised to whole steps: with gradient accumulation and P data-parallel processes,
tokens_per_step = accumulation * P * B * T and the trainer reshapes the rows into
(accumulation, P * B, T); micro-step m of rank r is then exactly llm.c's sample
(step * accumulation + m) at rank r. The one difference from llm.c is at a shard's end: a window never
crosses a shard boundary and a shard holds S = (ntok - 1) // tokens_per_step whole windows, so up to
one step's worth of llm.c micro-samples at the tail of each shard is skipped.

Shards come from a sorted glob; after the last shard the stream wraps to the first (a new epoch), like
llm.c's sequential loader. `window(position)` is a pure function of the position, so saving the
position in the checkpoint makes resume exact; there is no hidden iterator state.

The train stream in llm.c's permuted order (`--shuffle llmc`), still a pure function of the position.

One llm.c batch ("sample") is a micro-step's tokens: rows_per_micro_step x seq_len (+1 target).
Step `position` reads samples position*A .. position*A + A - 1 of llm.c's sequence (A = gradient
accumulation), which may cross shard and epoch boundaries as llm.c's micro-steps do. Which shard
and sample the k-th one is comes from llmc_io.llmc_state, replaying dataloader.h's mt19937 from
its seed: the saved position alone makes a resume exact, and the llm.c loader state at any position
(for an llm.c state file, or to check one) is recomputed from it.

The train and validation streams of one run: which shards, at the run's batch geometry.

How a step's tokens split into micro-steps and data-parallel ranks (batch_geometry).
total_batch_size = batch_size × sequence_length × data_parallel × accumulation, as in
InfiniTrain, where data_parallel is the mesh's data × fsdp size (parallel/sharding.py; tensor-parallel
devices share their rows, and so do context-parallel ones: each takes a contiguous slice of
every row's T, as InfiniTrain's data loader is sharded by DP only). A step always consumes the
same contiguous `total_batch_size + 1` token window of the stream, whatever the
device count: its rows are split first over micro-steps, then over the data-parallel ranks,
so `--batch_size 1 --total_batch_size 512` trains on the same tokens per step on 8, 4 or 1
device, with 8× more accumulation on 1.

The default total_batch_size on a mesh it cannot fill.

total_batch_size defaults to InfiniTrain's 256 tokens a step, which is one micro-step of
batch 4 x 64 on one device, but less than one micro-step on more data-parallel ranks
(`launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4` has 8: 2048 tokens).
There, and only there (a default smaller than one micro-step), a run that left
total_batch_size at its default gets one micro-step per step (no accumulation) and a line
saying so, instead of a refusal; a total the user chose is never changed
(batch_geometry refuses it when it does not divide).
"""

from __future__ import annotations

import dataclasses
import glob
import operator
from typing import Iterator
import numpy as np

from jaxtrain.config.keys import DEFAULT_TOTAL
from llmc_io.llmc_state import LLMCOrder


# --- the batch geometry ---


@dataclasses.dataclass(frozen=True)
class BatchGeometry:
    batch_size: int  # rows per data-parallel rank per micro-step
    sequence_length: int  # T
    data_parallel: int  # ranks the batch is split over (mesh data × fsdp)
    accumulation: int  # micro-steps per optimizer step
    context: int = 1  # context-parallel slices of each row's T (mesh context; not in the token count)

    @property
    def rows_per_micro_step(self) -> int:
        return self.batch_size * self.data_parallel

    @property
    def tokens_per_step(self) -> int:
        return self.rows_per_micro_step * self.sequence_length * self.accumulation

    def describe(self) -> str:
        """'4 x 64 x DP 2 (data x fsdp) x accumulation 1 = 512 tokens/step', with
        ' (CP 2: 32 tokens a slice)' after the sequence length under context parallelism."""
        context = f' (CP {self.context}: {self.sequence_length // self.context} tokens a slice)'
        return (
            f'{self.batch_size} x {self.sequence_length}{context if self.context > 1 else ""} x DP '
            f'{self.data_parallel} (data x fsdp) x accumulation {self.accumulation} = '
            f'{self.tokens_per_step} tokens/step'
        )


def batch_geometry(
    batch_size: int, sequence_length: int, total_batch_size: int, data_parallel: int, context: int = 1
) -> BatchGeometry:
    """total_batch_size 0 means one micro-step: batch_size × sequence_length × data_parallel."""
    for key, value in (
        ('batch_size', batch_size),
        ('sequence_length', sequence_length),
    ):
        if value <= 0:
            raise ValueError(f'{key}: expected a positive integer, found {value}')
    if total_batch_size < 0:
        raise ValueError(
            f'total_batch_size: expected a positive integer (or 0: one micro-step), found {total_batch_size}'
        )
    tokens_per_micro_step = batch_size * sequence_length * data_parallel
    total_batch_size = total_batch_size or tokens_per_micro_step
    if total_batch_size % tokens_per_micro_step:
        raise ValueError(
            f'total_batch_size: expected a multiple of batch_size × sequence_length × data_parallel '
            f'(mesh data × fsdp) = '
            f'{batch_size} × {sequence_length} × {data_parallel} = {tokens_per_micro_step}; found '
            f'{total_batch_size}. Pass --total_batch_size {tokens_per_micro_step} (no accumulation) '
            'or a multiple of it, or change batch_size.'
        )
    return BatchGeometry(
        batch_size, sequence_length, data_parallel, total_batch_size // tokens_per_micro_step, context
    )


def total_on_mesh(config, data_parallel: int) -> int:
    """The total_batch_size the run uses on `data_parallel` ranks."""
    micro_step = config.batch_size * config.sequence_length * data_parallel
    # Only a default smaller than one micro-step: a batch_size that does not divide it is
    # still refused (the user chose that batch_size).
    if config.total_batch_size != DEFAULT_TOTAL or micro_step <= config.total_batch_size:
        return config.total_batch_size
    return micro_step


def announce_total_on_mesh(config, data_parallel: int) -> int:
    """total_on_mesh, with a line when it is not the config's own value; the config is left as
    given (the run's geometry carries what it uses)."""
    total = total_on_mesh(config, data_parallel)
    if total != config.total_batch_size:
        _print_on_process_0(
            f'batch: total_batch_size {DEFAULT_TOTAL} (the default) is less than one micro-step '
            f'here ({config.batch_size} x {config.sequence_length} x DP {data_parallel} = {total} '
            f'tokens); using {total} (no accumulation). Pass --total_batch_size to choose.'
        )
    return total


# --- the streams ---


class DataError(ValueError):
    """A token-shard set that cannot feed the configured stream (what, where, expected, found)."""


def _read_shard(path: str) -> np.ndarray:
    # llmc_io owns the shard format (magic, version, ntok, exact file size); this module owns the order.
    from llmc_io.shards import read_shard

    return read_shard(path)


def _check_family(path: str, dtype: np.dtype, model_family: str) -> None:
    from llmc_io.shards import SHARD_KINDS

    expected = SHARD_KINDS[model_family]
    if dtype != expected.dtype:
        found = next(kind for kind in SHARD_KINDS.values() if kind.dtype == dtype)
        raise DataError(
            f"{path}: shard kind: expected a {model_family} shard (magic {expected.magic}, "
            f"{expected.dtype.name} tokens) for a {model_family} model, found a {found.name} shard "
            f"(magic {found.magic}, {found.dtype.name} tokens); tokenize the data for this model, "
            f"or train a {found.name} model (--config=configs/{found.name}.py)"
        )


class TokenStream:
    """llm.c token shards as a sequence of step-sized windows indexed by an integer position.

    Args:
      pattern: glob of llm.c token shards (GPT-2 uint16 or LLaMA-3 uint32); matched paths are sorted.
      tokens_per_step: tokens of input per window (= rows * seq_len); the window reads one more.
      seq_len: row length T; tokens_per_step must be a multiple of it.
      vocab_size: every token id must be below this (the unpadded vocabulary of the model).
      name: label for messages and the start-up log, e.g. 'train' or 'val'.
      model_family: 'gpt2' or 'llama3' to insist on that family's shards ('' = either). Ids of the
        other family's tokenizer may all be below vocab_size and would train without a complaint.
    """

    def __init__(
        self,
        pattern: str,
        tokens_per_step: int,
        seq_len: int,
        vocab_size: int,
        name: str = "train",
        model_family: str = "",
    ):
        self.name = name
        self.pattern = pattern
        self.tokens_per_step = int(tokens_per_step)
        self.seq_len = int(seq_len)
        self.vocab_size = int(vocab_size)
        if self.seq_len <= 0 or self.tokens_per_step <= 0 or self.tokens_per_step % self.seq_len:
            raise DataError(
                f"{name} data: tokens_per_step: expected a positive multiple of seq_len={self.seq_len}, "
                f"found {self.tokens_per_step}; set the batch so that tokens per step = rows * seq_len"
            )
        if self.vocab_size <= 0:
            raise DataError(f"{name} data: vocab_size: expected > 0, found {self.vocab_size}")
        self.rows = self.tokens_per_step // self.seq_len

        self.paths = sorted(glob.glob(pattern))
        if not self.paths:
            raise DataError(
                f"{name} data: pattern {pattern!r} matched no files; check the path (globs such as "
                f"'dir/*_train_*.bin' are allowed) or leave input_bin unset for the default corpus"
            )

        self.shards = [_read_shard(path) for path in self.paths]
        self.dtype = self.shards[0].dtype
        if model_family:
            _check_family(self.paths[0], self.dtype, model_family)
        for path, tokens in zip(self.paths, self.shards):
            # llm.c's llama3 dataloader.h also insists on one token width for the whole set.
            if tokens.dtype != self.dtype:
                raise DataError(
                    f"{path}: token dtype: expected {self.dtype} like {self.paths[0]}, found "
                    f"{tokens.dtype}; do not mix GPT-2 (uint16) and LLaMA-3 (uint32) shards in one pattern"
                )
            if len(tokens) < self.tokens_per_step + 1:
                raise DataError(
                    f"{path}: ntok: expected at least tokens_per_step + 1 = {self.tokens_per_step + 1} "
                    f"tokens for one {name} window ({self.rows} rows x {self.seq_len}), found {len(tokens)}; "
                    f"use a smaller batch or sequence length, or remove this shard from the pattern"
                )

        self.windows_per_shard = [(len(t) - 1) // self.tokens_per_step for t in self.shards]
        # first_window[i] = windows in shards before i; the last entry is the epoch length.
        self._first_window = np.concatenate([[0], np.cumsum(self.windows_per_shard)]).astype(np.int64)
        self.windows_per_epoch = int(self._first_window[-1])
        self.total_tokens = int(sum(len(t) for t in self.shards))
        self._vocabulary_checked = [False] * len(self.shards)

    # ---- position arithmetic ---------------------------------------------------------------------

    def _check_position(self, position) -> int:
        position = operator.index(position)  # rejects floats: positions are exact counts
        if position < 0:
            raise DataError(f"{self.name} data: position: expected >= 0, found {position}")
        return position

    def epoch_of(self, position: int) -> int:
        """Number of complete passes over all shards before window `position`."""
        return self._check_position(position) // self.windows_per_epoch

    def locate(self, position: int) -> tuple[int, int, int]:
        """(epoch, shard index, window index within that shard) of window `position`."""
        position = self._check_position(position)
        epoch, in_epoch = divmod(position, self.windows_per_epoch)
        shard = int(np.searchsorted(self._first_window, in_epoch, side="right")) - 1
        return epoch, shard, in_epoch - int(self._first_window[shard])

    # ---- reading ---------------------------------------------------------------------------------

    def tokens_at(self, shard: int, start: int, count: int) -> np.ndarray:
        """`count` tokens of shard file `shard` from offset `start`, as int32. The first read of a
        shard checks all its ids against the model's vocabulary (check_vocabulary)."""
        if not self._vocabulary_checked[shard]:
            self.check_vocabulary(shard)
        return np.asarray(self.shards[shard][start : start + count]).astype(np.int32)

    def check_vocabulary(self, shard: int) -> None:
        """Refuses shard file `shard` if an id is not below vocab_size, naming the file and the
        offset of the first such id. One vectorized max over the memory map (about 0.1 s per 100M
        tokens), paid shard by shard as the stream first reaches each, so a bad id stops the run
        before any batch of its shard is used rather than at the step that reads it."""
        tokens = self.shards[shard]
        if int(tokens.max()) >= self.vocab_size:
            at = int(np.argmax(tokens >= self.vocab_size))
            raise DataError(
                f"{self.paths[shard]}: token at offset {at}: expected id < vocab_size "
                f"{self.vocab_size}, found {int(tokens[at])}; the shards were tokenized for a different "
                f"vocabulary than the model's"
            )
        self._vocabulary_checked[shard] = True

    def window(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), each int32 of shape (rows, seq_len), for window `position`.

        Pure: the same position always gives the same arrays, whatever was read before.
        """
        _, shard, k = self.locate(position)
        tokens = self.tokens_at(shard, k * self.tokens_per_step, self.tokens_per_step + 1)
        inputs = tokens[:-1].reshape(self.rows, self.seq_len)
        targets = tokens[1:].reshape(self.rows, self.seq_len)
        return inputs, targets

    def val_windows(self, num_windows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The first `num_windows` windows from position 0, as llm.c's val loader reads after a reset.

        Asking for more windows than one epoch holds is an error rather than a silent repeat, since a
        wrapped validation set would count the same tokens twice.
        """
        num_windows = operator.index(num_windows)
        if not 0 <= num_windows <= self.windows_per_epoch:
            raise DataError(
                f"{self.name} data: windows requested: expected 0..{self.windows_per_epoch} (all that "
                f"{self.pattern!r} holds at {self.tokens_per_step + 1} tokens per window), found "
                f"{num_windows}; lower the number of validation steps or the validation batch"
            )
        for position in range(num_windows):
            yield self.window(position)

    def describe(self) -> str:
        """One line for the start-up log."""
        files = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files ({self.pattern})"
        return (
            f"{self.name} data: {files}, {self.total_tokens:,} tokens {self.dtype}, "
            f"{self.windows_per_epoch:,} windows/epoch of {self.rows}x{self.seq_len} tokens"
        )

    def __repr__(self) -> str:
        return f"TokenStream({self.describe()})"


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


def _print_on_process_0(line: str) -> None:
    import jax

    if jax.process_index() == 0:
        print(line, flush=True)


def data_paths(config) -> tuple[str, str]:
    """(train glob, val glob): the run's --input_bin, else the built-in corpus."""
    if config.input_bin:
        return config.input_bin, config.input_val_bin
    from jaxtrain.data.default_corpus import ensure_default_corpus

    # The built-in corpus, in the family's shards (the same bytes as the same ids for both).
    train_path, val_path = ensure_default_corpus(report=_print_on_process_0, family=config.model_family)
    return train_path, config.input_val_bin or val_path


def train_stream(config, geometry, vocab_size: int, pattern: str) -> TokenStream:
    """The train stream, in order or (--shuffle llmc) in llm.c's permuted order."""
    common = dict(name='train', model_family=config.model_family)
    if config.get('shuffle', 'none') == 'llmc':
        return LLMCShuffledStream(
            pattern,
            geometry.tokens_per_step,
            config.sequence_length,
            vocab_size,
            accumulation=geometry.accumulation,
            **common,
        )
    return TokenStream(pattern, geometry.tokens_per_step, config.sequence_length, vocab_size, **common)


def open_run_streams(config, geometry, vocab_size: int):
    """(train stream, val stream or None): a step reads one window of tokens_per_step."""
    train_pattern, val_pattern = data_paths(config)
    stream = train_stream(config, geometry, vocab_size, train_pattern)
    val_stream = None
    if config.val_loss_every > 0 and val_pattern:
        val_stream = TokenStream(
            val_pattern,
            geometry.rows_per_micro_step * config.sequence_length,
            config.sequence_length,
            vocab_size,
            name='val',
            model_family=config.model_family,
        )
        if config.val_max_steps > val_stream.windows_per_epoch:
            raise ValueError(
                f'val_max_steps: expected at most the {val_stream.windows_per_epoch} batches '
                f'{val_pattern} holds at this batch geometry, found {config.val_max_steps}'
            )
    return stream, val_stream
