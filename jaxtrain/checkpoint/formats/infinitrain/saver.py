"""The run's checkpointer for --checkpoint_format infinitrain|infinitrain-bin (format.py's
InfiniTrainFormat opens it).

A save runs in the background, as an Orbax one does: snapshot() copies the state on the device (the next
step donates the original), or to the host where the device has no room; one writer thread then streams
the files, each fetching its arrays from the copy as it starts (infinitrain.write_checkpoint: a
temporary directory renamed when complete, so nothing half-written looks committed). The copies of
those arrays to the host are dispatched by the loop between two steps (step_aligned_copies.py), a
bounded number of bytes ahead of the writer. A failed write
stops the run at the next save, or at wait() / close(). Saves rotate like ours: the newest
max_checkpoint_keep steps, every multiple of keep_every_steps, and the step the run resumed from are kept.
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import schedule as infinitrain_schedule
from jaxtrain.checkpoint.formats.infinitrain.steps import LRS_FORMAT
from jaxtrain.checkpoint.formats.infinitrain.trainer import save_step_dir
from jaxtrain.checkpoint.layout import (
    CheckpointError,
    later_steps,
    linked_steps,
    refuse_deleting_links,
    set_aside_uncommitted,
    step_dir_name,
)
from jaxtrain.checkpoint.format import Snapshot
from jaxtrain.checkpoint.manager import bytes_per_device, room_for_snapshot
from jaxtrain.checkpoint.layout import write_failure
from jaxtrain.checkpoint.pinned_host import (
    grow_pinned_host_pool_by,
    pinned_bytes_line,
    pinned_sharding,
    rows_per_piece,
)
from jaxtrain.checkpoint.step_aligned_copies import StepAlignedCopies
from jaxtrain.optim.optimizer import adam_states
from llmc_io.tensors import LeafEntry
from llmc_io.infinitrain.names import name_to_path
from llmc_io.tensors import tree_leaves


def batches_per_step(parts) -> int:
    """InfiniTrain DataLoader batches in one of our steps: accumulation x data-parallel ranks."""
    geometry = parts.geometry
    return geometry.accumulation * geometry.data_parallel


# How a leaf is held in the snapshot (_cuts): whole, as its layers, or (a positive number) as
# pieces of that many rows.
WHOLE, BY_LAYER = 0, -1
# The largest piece of a leaf the snapshot holds whole otherwise (an embedding, its moments): at
# LLaMA-3.2 1B a layer's largest kernel is 64 MiB, the embedding 1 GiB.
PIECE_BYTES = 64 * 2**20
# What the loop's copies for a write may hold at once (step_aligned_copies.py): at LLaMA-3.2 1B,
# about four steps' worth of writing at disk speed. The pinned pool is grown for it, and one
# buffer more, before step 1.
IN_FLIGHT_BYTES = 512 * 2**20


@functools.partial(jax.jit, static_argnums=1)
def _device_copy(tree, cuts: tuple[int, ...]):
    """A copy on the device that the next (donating) train step cannot take away, as the list of
    the tree's leaves; a leaf cut BY_LAYER (a stacked leaf the files hold layer by layer) comes as
    a tuple of its layers, one cut in row pieces as a tuple of those, each a buffer of its own.

    The writer fetches an entry (a layer) at a time. Cut from the stacked leaf as it is fetched,
    a layer would be a device computation queued behind the train steps already dispatched, and
    its copy to the host would wait for them. Cut here, with the copy the save makes anyway, the
    pieces are there before the next step runs, and the write makes no device computation. The
    row pieces keep each copy, and so the pinned memory a write holds, small."""
    leaves = jax.tree.leaves(tree)
    copied = []
    for leaf, cut in zip(leaves, cuts):
        if cut == BY_LAYER:
            copied.append(tuple(leaf[i] for i in range(leaf.shape[0])))
        elif cut > 0:
            copied.append(tuple(leaf[i : i + cut] for i in range(0, leaf.shape[0], cut)))
        else:
            copied.append(jnp.copy(leaf))
    return copied


def _cuts(items: dict, family: str) -> tuple[int, ...]:
    """For each leaf of items (jax.tree order), how the snapshot holds it: BY_LAYER where the
    files hold it layer by layer (its path below the item, 'h/attn/c_attn/kernel', an optimizer
    moment's as its parameter's, is a stacked path of the family's name table,
    llmc_io.infinitrain.names); in pieces of PIECE_BYTES' rows where it is larger; else WHOLE."""
    norm = tree_leaves(items['params']).get('h/ln_1/scale')  # (L, C): what a model of layers has
    stacked = (
        {path for path, layer, _ in name_to_path(family, norm.shape[0]).values() if layer is not None}
        if norm is not None
        else set()  # nothing to cut; the writer refuses such a tree with its own error
    )
    cuts = []
    for keys, leaf in jax.tree_util.tree_leaves_with_path(items):
        names = [str(k.key) for k in keys if isinstance(k, jax.tree_util.DictKey)]
        if '/'.join(names[1:]) in stacked:
            cuts.append(BY_LAYER)
        elif _in_pieces(leaf):
            cuts.append(rows_per_piece(leaf, PIECE_BYTES))
        else:
            cuts.append(WHOLE)
    return tuple(cuts)


def _in_pieces(leaf) -> bool:
    """Whether the snapshot holds a leaf the files do not hold by layer in row pieces: one over
    PIECE_BYTES, of several rows, copied to the host through pinned memory (an array over several
    devices is gathered whole; cutting it would only move its shards)."""
    if not isinstance(leaf, jax.Array) or leaf.ndim < 1 or leaf.shape[0] < 2 or leaf.nbytes <= PIECE_BYTES:
        return False
    return _copied_through_pinned(leaf)


def _largest_buffer(items: dict, cuts: tuple[int, ...]) -> int:
    """The bytes of the largest buffer the snapshot of `items` holds (_device_copy)."""

    def buffer_bytes(leaf, cut: int) -> int:
        if cut == WHOLE:
            return leaf.nbytes
        row_bytes = leaf.nbytes // leaf.shape[0]
        return row_bytes if cut == BY_LAYER else row_bytes * cut

    return max((buffer_bytes(leaf, cut) for leaf, cut in zip(jax.tree.leaves(items), cuts)), default=0)


def _items(params, opt_state, rng) -> dict:
    return {'params': params, 'opt_state': opt_state, 'rng': rng}


class _Pieces:
    """A leaf of the snapshot held as several device buffers (_device_copy): its layers
    (`stacked`, each a layer, the leaf their stack) or pieces of its rows (the leaf their
    concatenation). Not a pytree: jax.tree functions see it as one leaf."""

    def __init__(self, pieces: tuple, stacked: bool):
        self.pieces, self.stacked = pieces, stacked
        first = pieces[0]
        rows = len(pieces) if stacked else sum(piece.shape[0] for piece in pieces)
        self.shape = (rows, *first.shape) if stacked else (rows, *first.shape[1:])
        self.dtype = first.dtype

    def delete(self) -> None:
        for piece in self.pieces:
            if not piece.is_deleted():
                piece.delete()


def _pinned_copies(buffers: list) -> list:
    """Copies of single-device buffers into their device's pinned host memory, dispatched."""
    return jax.device_put(buffers, [pinned_sharding(next(iter(b.devices()))) for b in buffers])


def _copied_through_pinned(array) -> bool:
    devices = array.devices()
    return len(devices) == 1 and pinned_sharding(next(iter(devices))) is not None


class _HostFetch:
    """A device array, or a leaf the snapshot holds in _Pieces, that NumPy reads through pinned
    host memory, a buffer at a time: from the copy the loop dispatched ahead (`copies`), else
    copied when read.

    A copy into pageable memory (np.asarray of the device array) held the train steps beside it:
    at LLaMA-3.2 1B on an H200, steps of 130 ms took 600-1250 ms while a save fetched its 6 GB of
    weights. A copy into pinned memory is the device's own DMA; a buffer at a time, and the
    loop's copies bounded (IN_FLIGHT_BYTES), the pinned pool it takes from stays small. And the
    host copy is not cached on the device array (np.asarray would keep it there until the array
    is deleted), so each entry leaves the host once it is written. A layer (as the writer cuts the
    file's entries: llmc_io.tensors.LeafEntry) is its own buffer in the snapshot, so only that
    layer crosses, and fetching it computes nothing on the device."""

    def __init__(self, leaf, copies: StepAlignedCopies | None = None):
        self.leaf = leaf  # a jax.Array or _Pieces
        self.copies = copies
        self.shape, self.dtype = tuple(leaf.shape), leaf.dtype

    def _stacked(self) -> bool:
        return isinstance(self.leaf, _Pieces) and self.leaf.stacked

    def __getitem__(self, index: int) -> '_HostFetch':
        if not self._stacked():
            raise IndexError(f'the snapshot holds this leaf of shape {self.shape} whole, not by layer')
        return _HostFetch(self.leaf.pieces[index], self.copies)

    def buffers(self, layer: int | None) -> list:
        """The device buffers that hold `layer` of this leaf (all of it for None), in order; none
        where the leaf is held by layer and all of it is asked for (fetched layer by layer)."""
        if self._stacked():
            return [self.leaf.pieces[layer]] if layer is not None else []
        if layer is not None:
            return []
        return list(self.leaf.pieces) if isinstance(self.leaf, _Pieces) else [self.leaf]

    def __array__(self, dtype=None, copy=None):
        if self._stacked():  # the whole stacked leaf (llm.c's model file wants it so)
            value = np.stack([np.asarray(_HostFetch(layer, self.copies)) for layer in self.leaf.pieces])
        elif isinstance(self.leaf, _Pieces):  # row pieces, joined as they come
            value, start = np.empty(self.shape, self.dtype), 0
            for piece in self.leaf.pieces:
                value[start : start + piece.shape[0]] = np.asarray(_HostFetch(piece, self.copies))
                start += piece.shape[0]
        elif not _copied_through_pinned(self.leaf):
            # an array over several devices (a mesh's sharded or replicated leaf) is gathered plainly
            value = np.array(self.leaf)
        elif self.copies is not None:
            value = self.copies.fetch(self.leaf)
        else:
            value = np.array(_pinned_copies([self.leaf])[0])
        return value if dtype is None else value.astype(dtype, copy=False)


def _planned_buffers(arrays) -> list:
    """The device buffers a state-dict file's entries (writer.write_checkpoint's plan_fetches)
    fetch, in order; entries fetched otherwise are left out."""
    buffers = []
    for array in arrays:
        if not isinstance(array, LeafEntry):
            continue
        source = array.source
        if not isinstance(source, _HostFetch):  # a tied LLaMA's head: wte transposed when fetched
            source = getattr(source, 'leaf', None)
        if isinstance(source, _HostFetch):
            buffers.extend(b for b in source.buffers(array.layer) if _copied_through_pinned(b))
    return buffers


def _fetched_one_by_one(tree, copies: StepAlignedCopies | None):
    return jax.tree.map(
        lambda leaf: _HostFetch(leaf, copies) if isinstance(leaf, (jax.Array, _Pieces)) else leaf, tree
    )


class InfiniTrainCheckpointer:
    """A format.RunCheckpointer writing InfiniTrain step directories in the background."""

    def __init__(
        self,
        checkpoint_dir: str,
        fmt: str,
        parts,
        *,
        family: str,
        keep_latest: int,
        keep_every: int,
        protected_steps=(),
        config=None,
    ):
        # lr_scheduler.ckpt of each save; refuses, before training, a schedule upstream has not.
        self.scheduler_files = (
            infinitrain_schedule.SchedulerFiles(config, parts.schedule) if fmt == LRS_FORMAT else None
        )
        if jax.process_count() > 1:
            raise CheckpointError(
                f'checkpoint_format: {fmt} saves from one process only (it gathers every array on the host); '
                f'found {jax.process_count()} processes. Save as orbax, then convert a step with '
                f'python -m jaxtrain.ckpt export STEP_DIR --format {fmt} --output DIR.'
            )
        self.root = Path(checkpoint_dir).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.fmt, self.parts, self.family = fmt, parts, family
        self.keep_latest, self.keep_every = keep_latest, keep_every
        self.blocking_saves = 0  # saves whose snapshot was copied to the host while the loop waited
        self.synchronous = False  # save() returns before the step directory is renamed into place
        self._writer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix='jaxtrain-infinitrain-save'
        )
        self._pending = None  # the Future of the last write
        self._writing = None  # the step of the last save started
        self._snapshot_bytes = None  # per device, for the room check
        self._copy_program = None  # _device_copy compiled ahead of time by prepare(), if it ran
        self._cuts = None  # its static argument: how it cuts each leaf (_cuts)
        # The write's copies off the device, dispatched by the loop (between_steps).
        self.copies = StepAlignedCopies(_pinned_copies, IN_FLIGHT_BYTES)
        # The writer's threads take the GIL between their copies, hashing and writes; by default
        # the loop would wait up to 5 ms for it at a dispatch while a save is written (as
        # manager.Checkpointer, which bounds it the same way). close() gives the interval back.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, 0.001))
        # A step's name without InfiniTrain files is not ours (saves are atomic renames): moved
        # aside, never deleted, as the Orbax root does.
        self.set_aside = set_aside_uncommitted(self.root, committed=lambda p: it.detect_kind(p) is not None)
        self.linked = linked_steps(self.root)
        self.protected = {s for s in (*protected_steps, *self.linked) if s is not None}
        self.best = set()  # --keep_best's steps (keep_best_steps)
        it.prune(self.root, 0)  # removes what a killed save left under a temporary name

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        steps = [it.step_number(d) for d in it.step_dirs(self.root)]
        later = later_steps(self.root, steps, start_step, overwrite)
        refuse_deleting_links(self.root, later, 'overwrite_later_checkpoints')
        for step in later:
            shutil.rmtree(self.step_dir(step))
        return later

    def prepare(self, params, opt_state, rng) -> str | None:
        """Compiles the snapshot's copy on the writer thread while training starts, and grows the
        pinned pool for the copies a write holds at once (IN_FLIGHT_BYTES, or the largest array);
        returns the line saying what was pinned, or None."""
        if jax.process_count() != 1:
            return None
        items = _items(params, opt_state, rng)
        self._snapshot_bytes = bytes_per_device(items)
        self._cuts = _cuts(items, self.family)
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), items)
        self._pending = self._writer.submit(self._compile_copy, shapes, self._cuts)
        # The bound, and room for one buffer more: a buffer larger than what is left goes alone.
        pool = IN_FLIGHT_BYTES + _largest_buffer(items, self._cuts)
        return pinned_bytes_line(pool, grow_pinned_host_pool_by(items, pool))

    def _compile_copy(self, shapes, cuts):
        try:
            self._copy_program = _device_copy.lower(shapes, cuts).compile()
        except Exception:  # not worth stopping a run for: the first save compiles it instead
            self._copy_program = None

    def _copy(self, items: dict) -> dict:
        """items copied on the device (_device_copy), leaves cut there as their _Pieces."""
        if self._cuts is None:
            self._cuts = _cuts(items, self.family)
        program = self._copy_program
        leaves = program(items) if program is not None else _device_copy(items, self._cuts)
        leaves = [
            _Pieces(leaf, stacked=cut == BY_LAYER) if isinstance(leaf, tuple) else leaf
            for leaf, cut in zip(leaves, self._cuts)
        ]
        return jax.tree.unflatten(jax.tree.structure(items), leaves)

    def snapshot(self, params, opt_state, rng) -> Snapshot:
        """The state as it is now, safe from the next step's donation: a device copy where the
        device has room for one (the loop goes on at once), else a host copy made here."""
        self._finish_write()  # one save at a time; a failed one stops the run now
        items = _items(params, opt_state, rng)
        if self._snapshot_bytes is None:
            self._snapshot_bytes = bytes_per_device(items)
        if room_for_snapshot(self._snapshot_bytes):
            return Snapshot(self._copy(items), None, copied=True)
        self.blocking_saves += 1
        return Snapshot(jax.device_get(items), None, copied=False)

    def save_snapshot(self, step: int, snapshot: Snapshot, trainer_state: dict):
        """Hands the snapshot of `step` to the writer thread and returns."""
        self._writing = step
        self.copies.loop_stepping(True)  # the loop goes on, and dispatches the write's copies
        self._pending = self._writer.submit(self._write, step, snapshot.items, dict(trainer_state))

    def save(self, step: int, params, opt_state, rng, trainer_state: dict):
        self.save_snapshot(step, self.snapshot(params, opt_state, rng), trainer_state)

    def _write(self, step: int, items: dict, trainer_state: dict):
        """The files fetch each entry from the snapshot as it is written (llmc_io.tensors.LeafEntry),
        so the host holds the entries being written, not the files; the device copy goes after."""
        try:
            # Read first, for the record: the rng, then Adam's step count (trainer.save_step_dir).
            adam = adam_states(items['opt_state']) if items['opt_state'] is not None else []
            self.copies.plan(
                leaf
                for leaf in [*jax.tree.leaves(items['rng']), *(state.count for state in adam[:1])]
                if isinstance(leaf, jax.Array) and _copied_through_pinned(leaf)
            )
            self._write_host(
                step,
                _fetched_one_by_one(items['params'], self.copies),
                _fetched_one_by_one(items['opt_state'], self.copies),
                jax.tree.map(np.asarray, _fetched_one_by_one(items['rng'], self.copies)),
                trainer_state,
            )
        finally:
            self.copies.forget()
            for leaf in jax.tree.leaves(items):
                if isinstance(leaf, _Pieces) or (isinstance(leaf, jax.Array) and not leaf.is_deleted()):
                    leaf.delete()

    def _write_host(self, step: int, params, opt_state, rng, trainer_state: dict):
        record = dict(trainer_state, rng=[int(x) for x in np.asarray(rng).reshape(-1)])
        parts = self.parts
        scheduler = self.scheduler_files.bytes_at(step) if self.scheduler_files else None
        try:
            save_step_dir(
                self.root,
                step,
                params,
                opt_state,
                record,
                self.fmt,
                family=self.family,
                model_config=parts.setup.model_config,
                batches_per_step=batches_per_step(parts),
                data_parallel=parts.geometry.data_parallel,
                context_parallel=parts.geometry.context,
                lr_scheduler=scheduler,
                plan_fetches=lambda arrays: self.copies.plan(_planned_buffers(arrays)),
            )
        except OSError as e:
            reason, advice = write_failure(e)
            steps = [it.step_number(d) for d in it.step_dirs(self.root)]
            kept = f'{step_dir_name(steps[-1])} and earlier are intact' if steps else 'no step was committed'
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: could not save {self.step_dir(step).name}: '
                f'{reason}; {kept}. {advice}, then resume with --resume_from latest.'
            ) from e
        it.prune(self.root, self.keep_latest, self.protected | self.best, self.keep_every)

    def between_steps(self) -> None:
        """Dispatches the next copies of the write under way (step_aligned_copies.py)."""
        self.copies.between_steps()

    def _finish_write(self):
        self.copies.loop_stepping(False)  # the loop waits for the write: it copies for itself
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # re-raises the write's CheckpointError

    def keep_best_steps(self, steps) -> None:
        """--keep_best's ranking (checkpoint/keep.py): kept out of rotation from the next save on."""
        self.best = set(steps)

    def wait(self):
        """Until every started save is committed on disk."""
        self._finish_write()

    def abort_notice(self) -> str:
        """For a run aborted at once (train/loop.py's stop on a signal): a save is renamed into place
        only when complete, so one still being written is lost, never half there."""
        steps = [it.step_number(d) for d in it.step_dirs(self.root)]
        newest = (
            f'the newest checkpoint is {self.step_dir(max(steps))}'
            if steps
            else f'no checkpoint in {self.root}'
        )
        if self._writing is not None and self._writing not in steps:
            return f'the save of {step_dir_name(self._writing)} was not committed and is lost; {newest}'
        return f'every save started was committed; {newest}; steps trained after it are lost'

    def close(self):
        try:
            self.wait()
        finally:
            self._writer.shutdown(wait=True)
            sys.setswitchinterval(self._switch_interval)
