"""The run's side of InfiniTrain checkpoints: a Checkpointer look-alike for --checkpoint_format
infinitrain|infinitrain-bin, and the resume hook for an InfiniTrain step directory.

Saves are synchronous (NumPy files, written into a temporary directory renamed when complete) and rotate
like ours: the newest max_checkpoint_keep steps, every multiple of keep_every_steps, and the step the run
resumed from are kept.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoint.formats import infinitrain as it
from jaxtrain.checkpoint.formats import infinitrain_schedule
from jaxtrain.checkpoint.formats.infinitrain_trainer import LRS_FORMAT, read_step_dir, save_step_dir
from jaxtrain.checkpoint.layout import CheckpointError, committed_steps, step_dir_name
from jaxtrain.checkpoint.manager import Checkpointer, Snapshot
from jaxtrain.checkpoint.trainer_state import compare_with_run
from jaxtrain.parallel import sharding
from llmc_io.errors import LLMCFormatError


def batches_per_step(parts) -> int:
    """InfiniTrain DataLoader batches in one of our steps: accumulation x data-parallel ranks."""
    geometry = parts.geometry
    return geometry.accumulation * geometry.data_parallel


class InfiniTrainCheckpointer:
    """save / wait / close / step_dir / refuse_later_steps, as manager.Checkpointer, for InfiniTrain files."""

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
        if jax.process_count() > 1:
            raise CheckpointError(
                f'checkpoint_format: {fmt} saves from one process only (it gathers every array on the host); '
                f'found {jax.process_count()} processes. Save as orbax, then convert a step with '
                f'python -m jaxtrain.ckpt export STEP_DIR --format {fmt} --output DIR.'
            )
        self.root = Path(checkpoint_dir).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.fmt, self.parts, self.family, self.config = fmt, parts, family, config
        if fmt == LRS_FORMAT:
            infinitrain_schedule.run_spec(config)  # refuses, before training, a schedule upstream has not
        self.keep_latest, self.keep_every = keep_latest, keep_every
        self.protected = {s for s in protected_steps if s is not None}
        self.blocking_saves = 0
        self.set_aside = []  # uncommitted step directories moved out of the way: none (saves are atomic renames)
        it.prune(self.root, 0)  # removes what a killed save left under a temporary name

    def step_dir(self, step: int) -> Path:
        return self.root / f'checkpoint_step_{step:06d}'

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        later = [d for d in it.step_dirs(self.root) if it.step_number(d) > start_step]
        if later and not overwrite:
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: expected no checkpoints after step {start_step}, found '
                f'{", ".join(d.name for d in later)}. Choose another --checkpoint_dir, or pass '
                '--config.overwrite_later_checkpoints=true to delete them.'
            )
        for d in later:
            shutil.rmtree(d)
        return [it.step_number(d) for d in later]

    def prepare(self, params, opt_state, rng):
        pass  # no snapshot program: saves are synchronous

    def snapshot(self, params, opt_state, rng) -> Snapshot:
        """Nothing to copy: save_snapshot() writes synchronously, before the next step donates
        the state."""
        return Snapshot({'params': params, 'opt_state': opt_state, 'rng': rng}, None, copied=False)

    def save_snapshot(self, step: int, snapshot: Snapshot, trainer_state: dict):
        self.save(step, snapshot.items['params'], snapshot.items['opt_state'], snapshot.items['rng'], trainer_state)

    def save(self, step: int, params, opt_state, rng, trainer_state: dict):
        record = dict(trainer_state, rng=[int(x) for x in np.asarray(jax.device_get(rng)).reshape(-1)])
        parts = self.parts
        scheduler = None
        if self.fmt == LRS_FORMAT:
            scheduler = infinitrain_schedule.scheduler_file_bytes(self.config, parts.schedule, step)
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
                lr_scheduler=scheduler,
            )
        except OSError as e:
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: could not save {self.step_dir(step).name}: '
                f'{e.strerror or e}; earlier steps are intact. Free space, then resume.'
            ) from e
        self.blocking_saves += 1
        it.prune(self.root, self.keep_latest, self.protected, self.keep_every)

    def wait(self):
        pass  # saves are synchronous

    def abort_notice(self) -> str:
        """For a run aborted at once (stop_signal.py): a synchronous save is either renamed into
        place or not started, so nothing half-written is lost."""
        steps = [it.step_number(d) for d in it.step_dirs(self.root)]
        newest = f'the newest checkpoint is {self.step_dir(max(steps))}' if steps else f'no checkpoint in {self.root}'
        return f'every save started was committed; {newest}; steps trained after it are lost'

    def close(self):
        pass


def open_checkpointer(config, parts, protected_steps):
    """The run's checkpointer for config.checkpoint_format, refusing a root that holds the other kind:
    Orbax's rotation would count (and delete) InfiniTrain step directories as its own, and ours would
    skip Orbax steps."""
    fmt = infinitrain_schedule.save_format(config)
    root = Path(config.checkpoint_dir)
    theirs = it.step_dirs(root)
    ours = committed_steps(root)
    if (fmt == 'orbax' and theirs) or (fmt != 'orbax' and ours):
        other = 'InfiniTrain' if fmt == 'orbax' else 'Orbax'
        found = theirs[0].name if fmt == 'orbax' else step_dir_name(ours[0])
        raise CheckpointError(
            f'checkpoint_dir: {root.absolute()}: expected only {fmt} checkpoints, found {other} ones '
            f'({found}); '
            'keep each kind in its own --checkpoint_dir (resuming from the other root is fine)'
        )
    if fmt == 'orbax':
        return Checkpointer(
            config.checkpoint_dir,
            keep_latest=config.max_checkpoint_keep,
            keep_every=config.keep_every_steps,
            protected_steps=protected_steps,
        )
    return InfiniTrainCheckpointer(
        config.checkpoint_dir,
        fmt,
        parts,
        family=config.model_family,
        keep_latest=config.max_checkpoint_keep,
        keep_every=config.keep_every_steps,
        protected_steps=protected_steps,
        config=config,
    )


def saved_best_loss(step_dir) -> float | None:
    """The running minimum loss a checkpoint recorded (ours or InfiniTrain's PR field), else None."""
    if step_dir is None:
        return None
    try:
        if it.detect_kind(step_dir):
            from llmc_io.infinitrain_state import read_trainer_state as read_infinitrain_state

            state = read_infinitrain_state(it.rank_dirs(step_dir)[0] / it.TRAINER_STATE)
            best = (state.jaxtrain or {}).get('best_loss', state.best_loss)
        else:
            from jaxtrain.checkpoint.trainer_state import read_trainer_state

            best = read_trainer_state(step_dir).get('best_loss')
    except (CheckpointError, LLMCFormatError, OSError):
        return None
    return float(best) if isinstance(best, (int, float)) and np.isfinite(best) else None


def _target(config) -> Path | None:
    """The InfiniTrain step directory config asks to resume from, or None (not an InfiniTrain one)."""
    source = config.resume_from  # HEAD's --load arrives here too (config/infinitrain_flags.py)
    if not source:
        return None
    if source == 'latest':
        if config.get('checkpoint_format', 'orbax') == 'orbax' or not config.checkpoint_dir:
            return None
        dirs = it.step_dirs(config.checkpoint_dir)
        return dirs[-1].absolute() if dirs else None
    path = Path(source).absolute()
    return path if it.detect_kind(path) else None


def resume_from_infinitrain(config, parts, resumed_cls):
    """A `resumed_cls` (checkpoint/resume.py's Resumed) when config resumes from an InfiniTrain step
    directory; None otherwise. Everything is checked (model family, names, shapes, vocabulary, batch
    geometry) before the run's state is touched."""
    step_dir = _target(config)
    if step_dir is None:
        return None
    state = parts.state
    try:
        params, opt_state, saved = read_step_dir(
            step_dir, state.params, state.opt_state, batches_per_step(parts), config.optimizer
        )
    except LLMCFormatError as e:
        raise CheckpointError(f'{e}') from None
    messages = list(saved.pop('messages'))
    generation = saved.pop('generation')
    messages += infinitrain_schedule.resume_schedule(
        config, parts.schedule, step_dir, saved['step'], generation
    )
    if 'model_config' in saved:  # written by jaxtrain: the same compatibility check as our own checkpoints
        incompatible, changes = compare_with_run(
            saved, dataclasses.asdict(parts.setup.model_config), config.to_dict()
        )
        if incompatible:
            raise CheckpointError(
                f'{step_dir}: does not fit this run: '
                + '; '.join(incompatible)
                + '. Resume it with the settings it was saved with, or start a new run.'
            )
        messages += [f'resume: changed since the checkpoint: {change}' for change in changes]
    if opt_state is None:
        from jaxtrain.checkpoint.resume import set_schedule_position

        fresh = lambda p: set_schedule_position(parts.tx.init(p), saved['step'])
        opt_state = jax.jit(fresh, out_shardings=parts.opt_shardings)(params)
    replicated = parts.replicated
    rng = (
        state.rng
        if saved['rng'] is None
        else sharding.put_global(np.asarray(saved['rng'], np.uint32), replicated)
    )
    if saved['rng'] is None:
        messages.append(
            f'resume: {step_dir} was written by InfiniTrain: no rng saved, keeping seed {config.seed}\'s'
        )
    state = state.replace(
        step=sharding.put_global(np.int32(saved['step']), replicated),
        data_position=sharding.put_global(np.int32(saved['data_position']), replicated),
        params=params,
        opt_state=opt_state,
        rng=rng,
    )
    messages.append(
        f"resume: restored step {saved['step']} from {step_dir} ({saved['kind']}, data position "
        f"{saved['data_position']})"
    )
    return resumed_cls(state, step_dir, saved, messages)
