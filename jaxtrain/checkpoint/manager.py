"""Orbax checkpoints of the whole training state: save, rotate, find, restore, check.

A checkpoint is `<checkpoint_dir>/checkpoint_step_000040/` written by an Orbax
CheckpointManager, with three items:
  params/         the parameters (pure dict, the llmc_io layout)
  opt_state/      the optax state, only when save_optimizer_state
  trainer_state/  JSON: step, data position, rng, schedule position, model and training
                  config, dtype, topology, versions, llmc source file + sha256, and a
                  checksum per tensor (verified on load)
Orbax writes a step into a temporary directory and renames it when complete, so a
killed save never looks committed; leftovers are removed when a manager opens the root.

The checksum per tensor is computed on the device, so a save never waits on a host hash: two
sums over each tensor's 32-bit patterns, modulo 2^32: the plain sum and the sum weighted by
(index + 1), which also catches swapped elements. Integer addition is associative, so the
result is the same for any sharding, reduction order or slicing: 8 devices verify on 1.

Where things are: layout.py (names, "committed"), trainer_state.py (the JSON record),
resume.py (resolve and restore). With many processes every process calls save and
restore (Orbax writes each process's shards and process 0 the metadata); only process 0
deletes directories.
"""

import concurrent.futures
import contextlib
import dataclasses
import re
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxtrain.checkpoint.format import Snapshot
from jaxtrain.checkpoint.layout import kept_steps
from jaxtrain.checkpoint.layout import (
    STEP_DIGITS,
    STEP_PREFIX,
    CheckpointError,
    committed_steps,
    later_steps,
    linked_steps,
    refuse_deleting_links,
    set_aside_uncommitted,
    step_dir_name,
)
from jaxtrain.checkpoint.orbax_host import (
    copy_in_pieces,
    pieces_to_pin,
    TransferOrder,
    release_waiting_threads,
    type_handlers,
)
from jaxtrain.checkpoint.pinned_host import grow_pinned_host_pool, leaves_to_pin, pinned_line
from jaxtrain.checkpoint.trainer_state import with_digest
from jaxtrain.checkpoint.layout import write_failure

# GB of a save that Orbax copies from the GPU to pinned host memory at once (its
# save_device_host_concurrent_gb; an array larger than this, such as a 1B model's 1.05 GB fp32
# embedding, is copied in a batch of its own). Small enough that pinning a batch before step 1
# takes under a second, not the 14 s that pinning a whole LLaMA-3.2 1B state took. On one H100
# with that state, 1 GB batches against 2 GB: commit 11.89 s against 12.33 s, the step after the
# first save 2.32x the median against 5.34x (the first 2 GB batch outgrew the pool pinned before
# step 1), peak RSS 7.1 GiB against 11.25 (bench/orbax_save_levers.py, call K in
# docs/benchmark-history.md).
HOST_TRANSFER_GB = 1

# MB of an array that a save copies to pinned host memory in one device_put (orbax_host.py, "The
# pieces"), where the state holds an array of more than HOST_PIECES_FROM_MB. On one H100 at
# LLaMA-3.2 1B (arrays up to 1.07 GB), in one call: the first step after a save 1.12x the median
# against 2.78x, the 20 steps after it 21.3 medians against 24.6, the commit 12.61 s against 10.45
# (bench/orbax_save_levers.py, call N in docs/benchmark-history.md); with the next batch copied
# while one is written (orbax_host.BATCHES_AHEAD), 11.92 s against 14.56 without (call 35).
# GPT-2 124M (154 MB at most) keeps Orbax's own copy: saving every 20 steps in pieces ran at 0.836x
# the run without saves (call N; 0.954x with the first version of the pieces, call M), below every
# figure measured without them (0.962-0.984x).
HOST_PIECE_MB = 64
HOST_PIECES_FROM_MB = 256


# --- checksums --------------------------------------------------------------------


def _bits_u32(x):
    if x.dtype.itemsize == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    return x.astype(jnp.uint32).reshape(-1)  # small integer leaves (optimizer counts)


@jax.jit
def _tensor_sums(tree):
    def sums(x):
        bits = _bits_u32(x)
        weights = jnp.arange(1, bits.size + 1, dtype=jnp.uint32)
        return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weights, dtype=jnp.uint32)])

    return jax.tree.map(sums, tree)


def path_name(path) -> str:
    """'h/attn/c_attn/kernel' for a pytree key path (dict keys, namedtuple fields, indices)."""
    parts = []
    for key in path:
        for attr in ('key', 'name', 'idx'):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return '/'.join(parts)


def start_tensor_sums(tree):
    """The checksums as device arrays, dispatched without waiting (for format_checksums)."""
    return _tensor_sums(tree)


def format_checksums(sums) -> dict[str, str]:
    """Fetches what start_tensor_sums dispatched, as tensor_checksums returns it."""
    sums = jax.device_get(sums)
    return {
        path_name(path): f'{int(s[0]):08x}:{int(s[1]):08x}'
        for path, s in jax.tree_util.tree_flatten_with_path(sums)[0]
    }


def tensor_checksums(tree) -> dict[str, str]:
    """{'h/attn/c_attn/kernel': '1a2b3c4d:5e6f7a8b', ...} for every array leaf of `tree`."""
    return format_checksums(start_tensor_sums(tree))


# Host arrays are summed this many elements at a time, so checking a 2 GB tensor needs tens of
# MB beside it rather than the three copies a whole-array kernel makes.
HOST_SLICE_ELEMENTS = 1 << 24


def host_checksum(array: np.ndarray) -> str:
    """tensor_checksums' value for one host array, summed in slices along its first axis: a
    slice that starts at element o adds its plain sum s, and its weighted sum w plus o·s."""
    if array.ndim == 0 or array.size <= HOST_SLICE_ELEMENTS:
        s, w = (int(v) for v in jax.device_get(_tensor_sums(array)))
        return f'{s:08x}:{w:08x}'
    row = array.size // array.shape[0]
    rows = max(1, HOST_SLICE_ELEMENTS // row)
    plain = weighted = 0
    for start in range(0, array.shape[0], rows):
        s, w = (int(v) for v in jax.device_get(_tensor_sums(array[start : start + rows])))
        plain, weighted = plain + s, weighted + w + start * row * s
    return f'{plain % 2**32:08x}:{weighted % 2**32:08x}'


def checksum_mismatches(found: dict[str, str], expected: dict[str, str], item: str) -> list[str]:
    """One line per tensor whose `found` checksum differs from, or lacks, the `expected` one."""
    problems = []
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            problems.append(f'{item}/{name}: listed in trainer_state but not restored')
        elif name not in expected:
            problems.append(f'{item}/{name}: restored but has no recorded checksum')
        elif found[name] != expected[name]:
            problems.append(f'{item}/{name}: checksum expected {expected[name]}, found {found[name]}')
    return problems


# --- rotation ---------------------------------------------------------------------


@dataclasses.dataclass
class _KeepPolicy:
    """Orbax preservation policy: newest `keep_latest` (0 = all), every multiple of
    `keep_every`, and the protected steps (the one this run resumed from)."""

    keep_latest: int
    keep_every: int
    protected: frozenset
    best: frozenset = frozenset()  # --keep_best's steps, replaced as the ranking changes

    def should_preserve(self, checkpoints, *, context):
        steps = [c.step for c in checkpoints]
        kept = kept_steps(steps, self.keep_latest, self.keep_every, self.protected | self.best)
        return [s in kept for s in steps]


# --- the manager ------------------------------------------------------------------


def _barrier(name: str):
    """Waits for every process (nothing to wait for with one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _stacked_sums(tree):
    """The checksums of every leaf as one (leaves, 2) array: one output, not one per leaf."""
    return jnp.stack(jax.tree.leaves(start_tensor_sums(tree)))


@jax.jit
def _snapshot(tree):
    """A copy on the device, which the next (donating) train step cannot take away, and
    its _stacked_sums, in one dispatch."""
    copy = jax.tree.map(jnp.copy, tree)
    return copy, _stacked_sums(copy)


def _items(params, opt_state, rng) -> dict:
    """The state's parts that a checkpoint holds (opt_state None: left out)."""
    items = {'params': params, 'rng': jnp.asarray(rng)}
    if opt_state is not None:
        items['opt_state'] = opt_state
    return items


def bytes_per_device(tree) -> dict:
    needed = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards if isinstance(leaf, jax.Array) else ():
            needed[shard.device] = needed.get(shard.device, 0) + shard.data.nbytes
    return needed


def room_for_snapshot(needed: dict, margin: float = 1.25) -> bool:
    """Whether every device has free memory for its bytes in `needed` (with a margin)."""
    for device, nbytes in needed.items():
        stats = device.memory_stats() or {}  # none on CPU, where host memory is the limit
        if 'bytes_limit' in stats and stats['bytes_limit'] - stats.get('bytes_in_use', 0) < margin * nbytes:
            return False
    return True


class Checkpointer:
    """Asynchronous, rotating saves of the training state into one checkpoint root.

    save() returns without waiting for the device: it copies the state on the device (the
    next step donates the original), dispatches the checksums, and hands both to one
    background thread, which gives them to Orbax. Orbax's own part that blocks its caller
    (the device-to-host copy, 80-100 ms for GPT-2 124M with AdamW on an H200) thus runs
    beside training, and its write continues in Orbax's background as before. Where the
    device has no room for the copy, or the run has several processes, save() does the
    hand-off itself (`blocking_saves` counts these). Failures of either stage surface at
    the next save(), wait() or close().
    """

    def __init__(
        self,
        checkpoint_dir: str,
        *,
        keep_latest: int,
        keep_every: int,
        protected_steps=(),
        host_transfer_gb=None,
    ):
        """host_transfer_gb: at most this many GB copied off the device at a time (see below); by
        default HOST_TRANSFER_GB on a GPU and no limit elsewhere, where the copies are not pinned."""
        self.root = Path(checkpoint_dir).absolute()
        # Orbax counts every directory with a step's name as a step; jaxtrain only a committed
        # one (layout.is_committed). One view for both: the others are moved aside first.
        _barrier('jaxtrain: before uncommitted steps are set aside')
        self.set_aside = set_aside_uncommitted(self.root) if jax.process_index() == 0 else []
        _barrier('jaxtrain: uncommitted steps set aside')
        self.linked = linked_steps(self.root)  # never deleted: Orbax's rmtree refuses links anyway
        protected_steps = (*protected_steps, *self.linked)
        self._keep_policy = _KeepPolicy(keep_latest, keep_every, frozenset(protected_steps))
        options = ocp.CheckpointManagerOptions(
            step_prefix=STEP_PREFIX,
            step_format_fixed_length=STEP_DIGITS,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=True,
            preservation_policy=self._keep_policy,
        )
        # Uncompressed tensors: Orbax's default zstd halves the write's speed for ~7% less
        # disk on float weights, and on a CPU run the write competes with the training
        # steps for the same cores, slowing the step after each save. Restore reads
        # either (the codec is in the array's metadata).
        # On a GPU, at most HOST_TRANSFER_GB of the snapshot is copied to pinned host memory
        # at a time (the rest waits on the device, where the snapshot already is): the pool
        # prepare() pins before step 1 is then that size, not the whole state.
        # Orbax then copies and writes a save of a snapshot one batch of that size after another,
        # once save() has returned (orbax_host.TransferOrder).
        if host_transfer_gb is None and jax.default_backend() == 'gpu':
            host_transfer_gb = HOST_TRANSFER_GB
        self._host_transfer_bytes = int(host_transfer_gb * 10**9) if host_transfer_gb else None
        self._piece_bytes = 0  # prepare() decides, from the state's largest array
        self._transfer_order = TransferOrder()
        tensors = lambda: ocp.PyTreeCheckpointHandler(  # noqa: E731
            use_compression=False,
            save_device_host_concurrent_gb=host_transfer_gb,
            type_handler_registry=type_handlers(self._transfer_order),
        )
        self.manager = ocp.CheckpointManager(
            self.root,
            options=options,
            item_handlers={
                'params': tensors(),
                'opt_state': tensors(),
                'trainer_state': ocp.JsonCheckpointHandler(),
            },
        )
        self._writing = None  # the step of the last save started
        self._handoff = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='jaxtrain-save')
        self._pending = None  # the Future of the last hand-off to Orbax
        self.blocking_saves = 0  # saves handed to Orbax on the loop's thread
        self.synchronous = False  # save() returns before the write is committed
        self._snapshot_bytes = None  # per device, measured by prepare() or the first save
        self._snapshot_program = _snapshot  # prepare() swaps in one compiled ahead of time
        # The hand-off thread and Orbax's writers run Python beside the training loop; by
        # default a thread waits up to 5 ms for the GIL, which the loop would feel at every
        # dispatch while a save is in flight. 1 ms bounds that wait, while this checkpointer is
        # open: close() gives the process its own interval back.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, 0.001))

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        later = later_steps(self.root, committed_steps(self.root), start_step, overwrite)
        refuse_deleting_links(self.root, later, 'overwrite_later_checkpoints')
        # Every process has listed the steps before process 0 deletes any, and sees them gone after.
        _barrier('jaxtrain: later checkpoints listed')
        if jax.process_index() == 0:
            for step in later:
                shutil.rmtree(self.root / step_dir_name(step))
        _barrier('jaxtrain: later checkpoints deleted')
        if later:
            self.manager.reload()
        return later

    def save(self, step: int, params, opt_state, rng, trainer_state: dict):
        """Starts saving `step`; opt_state None leaves it out. rng: the state's key data
        (on the device). trainer_state: the JSON record (trainer_state_record), to which
        the rng words and the per-tensor checksums are added in the background."""
        self.save_snapshot(step, self.snapshot(params, opt_state, rng), trainer_state)

    def prepare(self, params, opt_state, rng) -> str | None:
        """Compiles the snapshot's program in the hand-off thread while training starts, so that
        the first save does not wait for the compilation (0.4-0.8 s for GPT-2 124M on an H200),
        and on a GPU grows the pinned host pool that saves copy into (pinned_host.py), so
        that the first save does not stall the steps after it; where the state holds an array of
        more than HOST_PIECES_FROM_MB, saves copy it in pieces (orbax_host.copy_in_pieces, which
        acts for the whole process). Returns a start line saying what that pinned and how long it
        took; None where it pinned nothing."""
        if jax.process_count() != 1:
            return None  # those saves hand the live state to Orbax, no snapshot
        items = _items(params, opt_state, rng)
        largest = max((leaf.nbytes for leaf in jax.tree.leaves(items)), default=0)
        if jax.default_backend() == 'gpu' and largest > HOST_PIECES_FROM_MB * 10**6:
            self._piece_bytes = int(HOST_PIECE_MB * 10**6)
        copy_in_pieces(self._piece_bytes, self._host_transfer_bytes or 0)
        # Before the thread starts, so that nothing else runs on the device while it pins memory.
        # Saves in pieces need the pool for a few pieces at a time; otherwise for a batch.
        if self._piece_bytes:
            to_pin = pieces_to_pin(items, self._piece_bytes)
            pinned_s = grow_pinned_host_pool(to_pin, None)
        else:
            to_pin = leaves_to_pin(items, self._host_transfer_bytes)
            pinned_s = grow_pinned_host_pool(items, self._host_transfer_bytes)
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), items)
        self._pending = self._handoff.submit(self._compile_snapshot, shapes)
        self._snapshot_bytes = bytes_per_device(items)  # what snapshot() would measure at the first save
        return pinned_line(to_pin, pinned_s)

    def _compile_snapshot(self, shapes):
        try:
            self._snapshot_program = _snapshot.lower(shapes).compile()
        except Exception:  # not worth stopping a run for: the first save compiles it instead
            self._snapshot_program = _snapshot

    def snapshot(self, params, opt_state, rng) -> 'Snapshot':
        """The first half of save(): dispatches the on-device copy of the state. The loop calls
        it before it waits for the step's metrics, so the dispatch runs while the device is
        still busy with the step. save_snapshot() then hands the copy on; if the step turns out
        non-finite, the run stops and the copy is simply dropped."""
        self._finish_handoff()  # normally long done; one snapshot alive at a time
        try:  # a write that already failed stops the run now, not one save later
            self.manager.check_for_errors()
        except Exception as e:
            raise self._save_failed(e, self._writing) from e
        items = _items(params, opt_state, rng)
        if self._snapshot_bytes is None:  # the state's layout never changes within a run
            self._snapshot_bytes = bytes_per_device(items)
        # With several processes Orbax's save runs collectives of its own (broadcasts that
        # agree on names and steps); issued from a thread they could interleave with the
        # train steps' collectives in a different order on each process and deadlock, so
        # there the hand-off stays on the loop's thread (and takes the live state, before the
        # next step donates it).
        if jax.process_count() == 1 and room_for_snapshot(self._snapshot_bytes):
            return Snapshot(*self._snapshot_program(items), copied=True)
        return Snapshot(items, None, copied=False)

    def save_snapshot(self, step: int, snapshot: 'Snapshot', trainer_state: dict):
        """The second half of save(): gives the snapshot of `step` to the background thread
        (or, not copied, to Orbax here)."""
        self._writing = step  # from here on, an abort names this step as lost until it commits
        if snapshot.copied:
            self._pending = self._handoff.submit(
                self._hand_to_orbax, step, snapshot.items, snapshot.sums_Nx2, trainer_state, True
            )
        else:
            self.blocking_saves += 1
            self._hand_to_orbax(step, snapshot.items, _stacked_sums(snapshot.items), trainer_state, False)

    def _refuse_existing(self, step: int):
        """A step directory of this name that this run did not write (this run writes each
        step once): Orbax's save would replace it, since its manager has not seen it."""
        step_dir = self.step_dir(step)
        if step_dir.exists():
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: could not save {step_dir.name}: expected no such '
                'directory, found one this run did not write (is another run using this '
                f'checkpoint_dir?); it is left as it is. Pass another --checkpoint_dir, or resume '
                f'from it with --resume_from {step_dir}.'
            )

    def _hand_to_orbax(self, step: int, items: dict, sums_Nx2, trainer_state: dict, private: bool):
        """private: the items are a snapshot nothing else holds, so Orbax may copy them off the
        device after save() returns; otherwise it copies them before (the next step donates them)."""
        self._refuse_existing(step)
        sums_tree = jax.tree.unflatten(jax.tree.structure(items), list(np.asarray(sums_Nx2)))
        del sums_tree['rng']  # recorded as its words, not checksummed
        items = dict(items)
        rng = items.pop('rng')
        record = {
            **trainer_state,
            'rng': [int(x) for x in np.asarray(rng).reshape(-1)],
            'checksums': {name: format_checksums(tree) for name, tree in sums_tree.items()},
        }
        args = {name: ocp.args.PyTreeSave(tree) for name, tree in items.items()}
        args['trainer_state'] = ocp.args.JsonSave(with_digest(record))  # the digest covers every field
        # Returns once the live state is copied off the device, or at once for a private
        # snapshot (copied in batches afterwards); the write continues in Orbax's background. A
        # failed copy or write is raised by the next save or by wait()/close().
        self._transfer_order.in_batches = private  # asked within save(), not after
        try:
            self.manager.save(step, args=ocp.args.Composite(**args), force=True)
        except Exception as e:
            raise self._save_failed(e, step) from e

    def _finish_handoff(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # re-raises the hand-off's CheckpointError

    def between_steps(self) -> None:
        """Nothing: Orbax's thread copies each batch of a save off the device itself."""

    def keep_best_steps(self, steps) -> None:
        """--keep_best's ranking (checkpoint/keep.py): these steps are kept out of rotation
        from the next save on, in place of the ones given before."""
        self._keep_policy.best = frozenset(steps)

    def wait(self):
        """Until every started save is committed on disk."""
        self._finish_handoff()
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._save_failed(e, self._writing) from e

    def close(self):
        try:
            self.wait()
        except CheckpointError:
            release_waiting_threads()  # else they wait 20 minutes for a stage that failed
            with contextlib.suppress(Exception):  # it would raise the same failure again
                self.manager.close()
            raise
        finally:
            self._handoff.shutdown(wait=True)
            sys.setswitchinterval(self._switch_interval)
        self.manager.close()

    def _save_failed(self, error: Exception, step) -> CheckpointError:
        """One line: which save failed and why, what is still there, what to do. Orbax
        commits a step only when all of it is written and rotates only after a commit, so
        the committed steps are untouched."""
        text = ' '.join(str(error).split())
        named = re.search(rf'{STEP_PREFIX}_\d{{{STEP_DIGITS},}}', text)  # Orbax names the directory
        if named:
            failed = named.group(0)
        else:
            failed = step_dir_name(step) if step is not None else 'a checkpoint'
        reason, advice = write_failure(error)
        steps = committed_steps(self.root)
        kept = f'{step_dir_name(steps[-1])} and earlier are intact' if steps else 'no step was committed'
        return CheckpointError(
            f'checkpoint_dir: {self.root}: could not save {failed}: {reason}; {kept}. {advice}, '
            'then resume with --resume_from latest.'
        )

    def abort_notice(self) -> str:
        """For a run aborted at once: whether the last save is lost, and the newest
        committed step (read from disk: Orbax commits in its own thread)."""
        steps = committed_steps(self.root)
        newest = (
            f'the newest committed checkpoint is {self.step_dir(steps[-1])} (--resume_from latest resumes it)'
            if steps
            else f'no checkpoint is committed in {self.root}'
        )
        if self._writing is not None and self._writing not in steps:
            return f'the save of {step_dir_name(self._writing)} was not committed and is lost; {newest}'
        return f'every save started was committed; {newest}; steps trained after it are lost'

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)
