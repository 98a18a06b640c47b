"""InfiniTrain step directories as a checkpoint format (format.py): the run's checkpointer for
--checkpoint_format infinitrain|infinitrain-bin, and restoring a step of any InfiniTrain kind.

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

from jaxtrain.checkpoint.format import Resumed, Verification, fresh_optimizer_state
from jaxtrain.checkpoint.formats import infinitrain as it
from jaxtrain.checkpoint.formats import infinitrain_schedule
from jaxtrain.checkpoint.formats.infinitrain_trainer import LRS_FORMAT, read_step_dir, save_step_dir
from jaxtrain.checkpoint.layout import (
    CheckpointError,
    later_steps,
    linked_steps,
    refuse_deleting_links,
    set_aside_uncommitted,
    step_dir_name,
)
from jaxtrain.checkpoint.manager import Snapshot
from jaxtrain.checkpoint.trainer_state import compare_with_run
from jaxtrain.checkpoint.write_errors import write_failure
from jaxtrain.optim.optimizer import spelled_with_infinitrain_flags
from jaxtrain.parallel import sharding
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain_state import read_trainer_state as read_infinitrain_state


def batches_per_step(parts) -> int:
    """InfiniTrain DataLoader batches in one of our steps: accumulation x data-parallel ranks."""
    geometry = parts.geometry
    return geometry.accumulation * geometry.data_parallel


class InfiniTrainCheckpointer:
    """A format.RunCheckpointer writing InfiniTrain step directories, synchronously."""

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
        self.blocking_saves = 0
        self.synchronous = True  # save() returns once the step directory is renamed into place
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

    def prepare(self, params, opt_state, rng):
        pass  # no snapshot program: saves are synchronous

    def snapshot(self, params, opt_state, rng) -> Snapshot:
        """Nothing to copy: save_snapshot() writes synchronously, before the next step donates
        the state."""
        return Snapshot({'params': params, 'opt_state': opt_state, 'rng': rng}, None, copied=False)

    def save_snapshot(self, step: int, snapshot: Snapshot, trainer_state: dict):
        self.save(
            step, snapshot.items['params'], snapshot.items['opt_state'], snapshot.items['rng'], trainer_state
        )

    def save(self, step: int, params, opt_state, rng, trainer_state: dict):
        record = dict(trainer_state, rng=[int(x) for x in np.asarray(jax.device_get(rng)).reshape(-1)])
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
                lr_scheduler=scheduler,
            )
        except OSError as e:
            reason, advice = write_failure(e)
            steps = [it.step_number(d) for d in it.step_dirs(self.root)]
            kept = f'{step_dir_name(steps[-1])} and earlier are intact' if steps else 'no step was committed'
            raise CheckpointError(
                f'checkpoint_dir: {self.root}: could not save {self.step_dir(step).name}: '
                f'{reason}; {kept}. {advice}, then resume with --resume_from latest.'
            ) from e
        self.blocking_saves += 1
        it.prune(self.root, self.keep_latest, self.protected | self.best, self.keep_every)

    def keep_best_steps(self, steps) -> None:
        """--keep_best's ranking (checkpoint/keep_best.py): kept out of rotation from the next save on."""
        self.best = set(steps)

    def wait(self):
        pass  # saves are synchronous

    def abort_notice(self) -> str:
        """For a run aborted at once (stop_signal.py): a synchronous save is either renamed into
        place or not started, so nothing half-written is lost."""
        steps = [it.step_number(d) for d in it.step_dirs(self.root)]
        newest = (
            f'the newest checkpoint is {self.step_dir(max(steps))}'
            if steps
            else f'no checkpoint in {self.root}'
        )
        return f'every save started was committed; {newest}; steps trained after it are lost'

    def close(self):
        pass


class InfiniTrainFormat:
    """One InfiniTrain kind (infinitrain.py's KINDS): every kind restores; infinitrain and
    infinitrain-bin also write."""

    title = 'InfiniTrain'

    def __init__(self, kind: str):
        self.name = kind

    def owns(self, step_dir) -> bool:
        return it.detect_kind(step_dir) is not None

    def committed_steps(self, root) -> list[int]:
        return [it.step_number(d) for d in it.step_dirs(root)]

    def open(self, config, parts, protected_steps) -> InfiniTrainCheckpointer:
        # infinitrain with InfiniTrain's schedule flags writes their generation (infinitrain_schedule.py).
        lrs = self.name == it.HEAD_KIND and spelled_with_infinitrain_flags(config)
        fmt = LRS_FORMAT if lrs else self.name
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

    def read_record(self, step_dir) -> dict:
        """The "jaxtrain" object of trainer_state.json (what only we write), with InfiniTrain's
        own step and best_loss where it has none."""
        state = read_infinitrain_state(it.rank_dirs(step_dir)[0] / it.TRAINER_STATE)
        record = dict(state.jaxtrain or {})
        record.setdefault('step', state.global_step)
        record.setdefault('best_loss', state.best_loss)
        return record

    def verify(self, step_dir) -> Verification:
        """Every rank's files parse and fit one model; the data-parallel replicas are equal; the
        jaxtrain record's digest and every file's recorded sha256 hold (rank directories
        included); finite weights, Adam's t, the scheduler file."""
        from jaxtrain.tools.ckpt_infinitrain import verify

        return verify(step_dir)

    def restore_into(self, config, parts, step_dir: Path) -> Resumed:
        """Everything is checked (model family, names, shapes, vocabulary, batch geometry)
        before the run's state is touched."""
        state = parts.state
        try:
            params, opt_state, saved = read_step_dir(
                step_dir,
                state.params,
                state.opt_state,
                batches_per_step(parts),
                config.optimizer,
                (config.pipeline_parallel, config.virtual_pipeline_parallel),
            )
        except LLMCFormatError as e:
            raise CheckpointError(f'{e}') from None
        messages = list(saved.pop('messages'))
        generation = saved.pop('generation')
        messages += infinitrain_schedule.resume_schedule(
            config, parts.schedule, step_dir, saved['step'], generation
        )
        if 'model_config' in saved:  # written by jaxtrain: the compatibility check of our own checkpoints
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
            opt_state = fresh_optimizer_state(parts, params, saved['step'])
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
        return Resumed(state, step_dir, saved, messages)
