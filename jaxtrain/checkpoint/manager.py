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

Resume order (train.py): an explicit `resume_from` step directory, or `latest` (newest
committed step in checkpoint_dir), else the llmc file, else random init.

Topology: arrays are saved sharded as they live on the mesh, and restored onto the
current run's shardings whatever the saving mesh was (8 devices -> 1, 1 -> 8, FSDP ->
data parallel); the trainer state records the saving topology and the resume line names
what changed. With many processes every process calls save and restore (Orbax writes
each process's shards and process 0 the metadata); only process 0 deletes directories.
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from jaxtrain.checkpoint.checksums import checksum_mismatches, format_checksums, start_tensor_sums

STEP_PREFIX = 'checkpoint_step'
STEP_DIGITS = 6
_STEP_DIR = re.compile(rf'^{STEP_PREFIX}_(\d{{{STEP_DIGITS},}})$')
TRAINER_STATE_FILE = Path('trainer_state') / 'metadata'  # where Orbax's JsonSave puts it
_UNFINISHED_SAVE = '.orbax-checkpoint-tmp'  # in the name of a step Orbax is still writing
DAMAGED = 'the checkpoint is damaged: resume from an earlier step (python -m jaxtrain.ckpt ls lists them)'


class CheckpointError(Exception):
    """A problem with a checkpoint or the checkpoint settings; the message is one line."""


def step_dir_name(step: int) -> str:
    return f'{STEP_PREFIX}_{step:0{STEP_DIGITS}d}'


def step_of(step_dir: Path) -> int | None:
    match = _STEP_DIR.match(Path(step_dir).name)
    return int(match.group(1)) if match else None


def is_committed(step_dir: Path) -> bool:
    """A finished Orbax step: final name (not a tmp name) and its trainer state present."""
    return step_of(step_dir) is not None and (Path(step_dir) / TRAINER_STATE_FILE).is_file()


def committed_steps(root) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(step_of(p) for p in root.iterdir() if p.is_dir() and is_committed(p))


def resolve_resume(resume_from: str, checkpoint_dir: str) -> tuple[Path | None, str]:
    """Returns (step directory or None, a notice for the log)."""
    if not resume_from:
        return None, ''
    if resume_from == 'latest':
        if not checkpoint_dir:
            raise CheckpointError(
                "resume_from: 'latest' needs checkpoint_dir; found checkpoint_dir empty. "
                'Pass --checkpoint_dir DIR.'
            )
        steps = committed_steps(checkpoint_dir)
        if not steps:
            return None, f'resume_from=latest: no committed checkpoint in {checkpoint_dir}; starting fresh'
        # Absolute: Orbax refuses relative paths, and the README's commands use them.
        return Path(checkpoint_dir).absolute() / step_dir_name(steps[-1]), ''
    path = Path(resume_from).absolute()
    if not path.exists():
        raise CheckpointError(
            f'resume_from: {path}: expected a {STEP_PREFIX}_NNNNNN directory, found nothing there'
        )
    if _UNFINISHED_SAVE in path.name:
        steps = committed_steps(path.parent)
        pick = (
            f'Pick a committed step instead: {", ".join(step_dir_name(s) for s in steps)}'
            if steps
            else f'{path.parent} holds no committed step to pick instead'
        )
        raise CheckpointError(
            f'resume_from: {path}: expected a committed checkpoint, found an unfinished save (the '
            f'temporary name Orbax writes under until a save completes). {pick}.'
        )
    if step_of(path) is not None:
        if not is_committed(path):
            raise CheckpointError(
                f'resume_from: {path}: expected a committed checkpoint, found no '
                f'{TRAINER_STATE_FILE} (an interrupted or damaged save). Pick an earlier step.'
            )
        return path, ''
    steps = committed_steps(path)
    if steps:
        names = ', '.join(step_dir_name(s) for s in steps)
        raise CheckpointError(
            f'resume_from: {path}: expected a step directory, found a checkpoint root '
            f'holding {names}. Pass one of them, e.g. {path / step_dir_name(steps[-1])}, '
            f'or --resume_from latest --checkpoint_dir {path}.'
        )
    raise CheckpointError(
        f'resume_from: {path}: expected a {STEP_PREFIX}_NNNNNN directory, found a '
        'directory that is not a checkpoint'
    )


def read_trainer_state(step_dir) -> dict:
    path = Path(step_dir) / TRAINER_STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f'{path}: expected the trainer state JSON, found no file; {DAMAGED}') from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f'{path}: expected JSON, found unreadable content ({e}); {DAMAGED}') from None


def check_resumable(trainer_state: dict, step_dir) -> None:
    """The fields a resume uses, checked before anything is restored, so that an edited or
    damaged trainer state is named here rather than failing later without its file."""
    path = Path(step_dir) / TRAINER_STATE_FILE
    for key in ('step', 'data_position'):
        value = trainer_state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            found = 'none' if key not in trainer_state else repr(value)
            raise CheckpointError(f'{path}: {key}: expected an integer >= 0, found {found}; {DAMAGED}')
    rng = trainer_state.get('rng')
    if not (isinstance(rng, list) and rng and all(isinstance(x, int) and 0 <= x < 2**32 for x in rng)):
        found = 'none' if 'rng' not in trainer_state else repr(rng)
        raise CheckpointError(f'{path}: rng: expected a list of uint32 key words, found {found}; {DAMAGED}')


def trainer_state_record(
    config,
    *,
    step: int,
    data_position: int,
    epoch: int,
    learning_rate: float,
    model_config: dict,
    tokens_per_step: int,
    topology: dict,
    versions: dict,
    llmc_file: str,
    llmc_sha256: str,
) -> dict:
    """The trainer_state JSON of one checkpoint (every field `ckpt show` prints), less the
    rng and the per-tensor checksums, which Checkpointer.save adds off the loop."""
    return {
        'step': step,
        'data_position': data_position,
        'epoch': epoch,
        'learning_rate': learning_rate,
        'model_family': config.model_family,
        'model_config': model_config,
        'training_config': config.to_dict(),
        'dtype': config.dtype,
        'tokens_per_step': tokens_per_step,
        'topology': topology,
        'versions': versions,
        'llmc_file': llmc_file,
        'llmc_sha256': llmc_sha256,
        'has_optimizer_state': bool(config.save_optimizer_state),
        'saved_at': time.time(),
    }


# --- compatibility between a checkpoint and the current run -------------------------

# Keys whose change makes the saved state meaningless for this run.
_MUST_MATCH = ('model_family', 'optimizer', 'sequence_length', 'total_batch_size')
# Keys that may change between runs; the change is reported.
_MAY_CHANGE = (
    'learning_rate',
    'lr_schedule',
    'warmup_steps',
    'min_lr_ratio',
    'num_iteration',
    'beta1',
    'beta2',
    'eps',
    'weight_decay',
    'grad_clip',
    'dtype',
    'batch_size',
    'input_bin',
    'save_steps',
    'max_checkpoint_keep',
    'keep_every_steps',
    'save_every_minutes',
    'save_optimizer_state',
    'attention',
    'deterministic',
    'num_devices',
    'mesh_data',
    'mesh_fsdp',
    'mesh_tensor',
    'val_loss_every',
    'input_val_bin',
)


def compare_with_run(saved: dict, model_config: dict, training_config: dict) -> tuple[list[str], list[str]]:
    """Returns (incompatible fields, allowed changes), each 'field: checkpoint X, now Y'."""
    incompatible, changes = [], []
    saved_model = saved.get('model_config', {})
    for key in sorted(set(saved_model) | set(model_config)):
        if saved_model.get(key) != model_config.get(key):
            incompatible.append(
                f'model_config.{key}: checkpoint {saved_model.get(key)!r}, now {model_config.get(key)!r}'
            )
    saved_training = saved.get('training_config', {})
    for key in _MUST_MATCH:
        if saved_training.get(key) != training_config.get(key):
            incompatible.append(
                f'{key}: checkpoint {saved_training.get(key)!r}, now {training_config.get(key)!r}'
            )
    for key in _MAY_CHANGE:
        if key in saved_training and saved_training.get(key) != training_config.get(key):
            changes.append(f'{key}: checkpoint {saved_training.get(key)!r}, now {training_config.get(key)!r}')
    return incompatible, changes


def describe_topology(topology: dict) -> str:
    """'8 cpu devices in 1 process, mesh data 2 × fsdp 4 × tensor 1' (fields may be missing
    in older checkpoints: '?')."""
    mesh = ' × '.join(f'{axis} {size}' for axis, size in topology.get('mesh', {}).items()) or '?'
    return (
        f"{topology.get('device_count', '?')} {topology.get('platform', '?')} device(s) in "
        f"{topology.get('process_count', '?')} process(es), mesh {mesh}"
    )


def topology_change(saved: dict, now: dict) -> str:
    """One clause for the resume line: 'same topology (...)' or 'topology changed: ... -> ...'."""
    fields = ('platform', 'device_count', 'process_count', 'mesh')
    if all(saved.get(f) == now.get(f) for f in fields):
        return f'same topology ({describe_topology(now)})'
    return f'topology changed: saved on {describe_topology(saved)}, now {describe_topology(now)}'


# --- rotation ---------------------------------------------------------------------


@dataclasses.dataclass
class _KeepPolicy:
    """Orbax preservation policy: newest `keep_latest` (0 = all), every multiple of
    `keep_every`, and the protected steps (the one this run resumed from)."""

    keep_latest: int
    keep_every: int
    protected: frozenset

    def should_preserve(self, checkpoints, *, context):
        steps = [c.step for c in checkpoints]
        newest = set(sorted(steps)[-self.keep_latest :]) if self.keep_latest else set(steps)
        return [
            s in newest or s in self.protected or (self.keep_every > 0 and s % self.keep_every == 0)
            for s in steps
        ]


# --- the manager ------------------------------------------------------------------


def _barrier(name: str):
    """Waits for every process (nothing to wait for with one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


_WRITE_ERRORS = (
    'No space left on device',
    'Disk quota exceeded',
    'File too large',
    'Read-only file system',
    'Permission denied',
)


def _stacked_sums(tree):
    """The checksums (checksums.py) of every leaf as one (leaves, 2) array: one output
    instead of one per leaf, since the loop waits for the dispatch."""
    return jnp.stack(jax.tree.leaves(start_tensor_sums(tree)))


@jax.jit
def _snapshot(tree):
    """A copy on the device, which the next (donating) train step cannot take away, and
    its _stacked_sums, in one dispatch."""
    copy = jax.tree.map(jnp.copy, tree)
    return copy, _stacked_sums(copy)


def _bytes_per_device(tree) -> dict:
    needed = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            needed[shard.device] = needed.get(shard.device, 0) + shard.data.nbytes
    return needed


def _room_for_snapshot(needed: dict, margin: float = 1.25) -> bool:
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

    def __init__(self, checkpoint_dir: str, *, keep_latest: int, keep_every: int, protected_steps=()):
        self.root = Path(checkpoint_dir).absolute()
        options = ocp.CheckpointManagerOptions(
            step_prefix=STEP_PREFIX,
            step_format_fixed_length=STEP_DIGITS,
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=True,
            preservation_policy=_KeepPolicy(keep_latest, keep_every, frozenset(protected_steps)),
        )
        self.manager = ocp.CheckpointManager(
            self.root, options=options, item_names=('params', 'opt_state', 'trainer_state')
        )
        self._writing = None  # the step of the last save started
        self._handoff = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='jaxtrain-save')
        self._pending = None  # the Future of the last hand-off to Orbax
        self.blocking_saves = 0  # saves handed to Orbax on the loop's thread
        self._snapshot_bytes = None  # per device, measured at the first save
        # The hand-off thread and Orbax's writers run Python beside the training loop; by
        # default a thread waits up to 5 ms for the GIL, which the loop would feel at every
        # dispatch while a save is in flight. 1 ms bounds that wait.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        """Orbax skips saving a step ≤ its latest, so later steps would silently win."""
        later = [s for s in committed_steps(self.root) if s > start_step]
        if later and not overwrite:
            names = ', '.join(step_dir_name(s) for s in later)
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: expected no checkpoints after step {start_step}, found {names}. '
                'Choose another --checkpoint_dir, resume from the newest one (--resume_from latest), or pass '
                '--config.overwrite_later_checkpoints=true to delete them.'
            )
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
        self._finish_handoff()  # normally long done; one snapshot alive at a time
        try:  # a write that already failed stops the run now, not one save later
            self.manager.check_for_errors()
        except Exception as e:
            raise self._save_failed(e, self._writing) from e
        items = {'params': params, 'rng': jnp.asarray(rng)}
        if opt_state is not None:
            items['opt_state'] = opt_state
        if self._snapshot_bytes is None:  # the state's layout never changes within a run
            self._snapshot_bytes = _bytes_per_device(items)
        # With several processes Orbax's save runs collectives of its own (broadcasts that
        # agree on names and steps); issued from a thread they could interleave with the
        # train steps' collectives in a different order on each process and deadlock, so
        # there the hand-off stays on the loop's thread.
        if jax.process_count() == 1 and _room_for_snapshot(self._snapshot_bytes):
            snapshot, sums = _snapshot(items)
            self._pending = self._handoff.submit(self._hand_to_orbax, step, snapshot, sums, trainer_state)
        else:
            self.blocking_saves += 1
            self._hand_to_orbax(step, items, _stacked_sums(items), trainer_state)
        self._writing = step

    def _hand_to_orbax(self, step: int, items: dict, sums_Nx2, trainer_state: dict):
        sums_tree = jax.tree.unflatten(jax.tree.structure(items), list(np.asarray(sums_Nx2)))
        del sums_tree['rng']  # recorded as its words, not checksummed
        items = dict(items)
        rng = items.pop('rng')
        record = {
            **trainer_state,
            'rng': [int(x) for x in np.asarray(rng).reshape(-1)],
            'checksums': {name: format_checksums(tree) for name, tree in sums_tree.items()},
        }
        args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
        args['trainer_state'] = ocp.args.JsonSave(record)
        # Returns once the arrays are copied off the device; the write continues in Orbax's
        # background. A failed write is raised by the next save or by wait()/close().
        try:
            self.manager.save(step, args=ocp.args.Composite(**args), force=True)
        except Exception as e:
            raise self._save_failed(e, step) from e

    def _finish_handoff(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # re-raises the hand-off's CheckpointError

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
            with contextlib.suppress(Exception):  # it would raise the same failure again
                self.manager.close()
            raise
        finally:
            self._handoff.shutdown(wait=True)
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
        reason = next((r for r in _WRITE_ERRORS if r in text), None) or (text[:160] or type(error).__name__)
        steps = committed_steps(self.root)
        kept = f'{step_dir_name(steps[-1])} and earlier are intact' if steps else 'no step was committed'
        return CheckpointError(
            f'checkpoint_dir: {self.root}: could not save {failed}: {reason}; {kept}. Free space, '
            'then resume with --resume_from latest.'
        )

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def restore(step_dir: Path, params_like, opt_state_like):
    """Restores (params, opt_state or None, trainer_state) onto the shardings of the
    given live trees; the optimizer state is restored against its abstract tree so
    optax's namedtuples come back as namedtuples. Checksums are verified."""
    step_dir = Path(step_dir).absolute()  # Orbax refuses relative paths
    trainer_state = read_trainer_state(step_dir)
    check_resumable(trainer_state, step_dir)
    has_opt_state = (step_dir / 'opt_state').is_dir()
    if trainer_state.get('has_optimizer_state') and not has_opt_state:
        raise CheckpointError(
            f'{step_dir}: opt_state: expected the optimizer state (the trainer state says '
            f'has_optimizer_state), found no opt_state directory; {DAMAGED}'
        )
    params = _restore_item(step_dir, 'params', params_like)
    opt_state = _restore_item(step_dir, 'opt_state', opt_state_like) if has_opt_state else None
    checksums = trainer_state.get('checksums', {})
    problems = checksum_mismatches(params, checksums.get('params', {}), 'params')
    if opt_state is not None:
        problems += checksum_mismatches(opt_state, checksums.get('opt_state', {}), 'opt_state')
    if problems:
        raise CheckpointError(
            f'{step_dir}: checksum verification failed: ' + '; '.join(problems) + f'; {DAMAGED}'
        )
    return params, opt_state, trainer_state


def _restore_item(step_dir: Path, item: str, like):
    try:
        return ocp.StandardCheckpointer().restore(step_dir / item, _abstract(like))
    except Exception as e:  # Orbax and TensorStore raise many kinds for a damaged item
        text = ' '.join(str(e).split()).split(' See full TensorStore details')[0] or type(e).__name__
        reason = text if len(text) <= 160 else text[:157] + '...'
        raise CheckpointError(
            f'{step_dir}: {item}: could not restore the saved arrays ({reason}); {DAMAGED}'
        ) from e


def set_schedule_position(opt_state, step: int):
    """Fresh optimizer moments, but the learning-rate schedule continues at `step`."""
    is_schedule = lambda s: isinstance(s, optax.ScaleByScheduleState)
    return jax.tree.map(
        lambda s: optax.ScaleByScheduleState(count=np.asarray(step, np.int32)) if is_schedule(s) else s,
        opt_state,
        is_leaf=is_schedule,
    )
