"""When the loop saves, and what it hands the checkpointer: the save policy of one run.

A step is saved when it is a multiple of save_steps, when save_every_minutes have passed
since the last save, at the last step, and when the run is stopping on a signal.
"""

import dataclasses
import time

import jax

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint.manager import Checkpointer
from jaxtrain.checkpoint.trainer_state import file_sha256, library_versions, trainer_state_record
from jaxtrain.train.save_events import SaveEvents


class RunSaver:
    """Owns the run's Checkpointer (None without a checkpoint_dir) and remembers the last
    save, which is also the last good state should a later step go non-finite."""

    def __init__(self, config, parts, stream, resume_dir, start_step: int, report=None):
        """`report`: where the per-save and per-rotation lines go (save_events.py)."""
        self.config, self.parts, self.stream = config, parts, stream
        self.resume_dir = resume_dir
        self.saving = bool(config.checkpoint_dir) and (config.save_steps > 0 or config.save_every_minutes > 0)
        self.checkpointer = None
        self.deleted_later_steps = []
        self.events = None
        if config.checkpoint_dir:
            # The checkpoint this run resumed from is never rotated away.
            protected = (
                [layout.step_of(resume_dir)]
                if resume_dir is not None
                and resume_dir.parent.absolute() == layout.Path(config.checkpoint_dir).absolute()
                else []
            )
            self.checkpointer = Checkpointer(
                config.checkpoint_dir,
                keep_latest=config.max_checkpoint_keep,
                keep_every=config.keep_every_steps,
                protected_steps=protected,
            )
            self.deleted_later_steps = self.checkpointer.refuse_later_steps(
                start_step, config.overwrite_later_checkpoints
            )
            if jax.process_index() == 0:  # the one that prints
                self.events = SaveEvents(
                    self.checkpointer.root,
                    keep_latest=config.max_checkpoint_keep,
                    keep_every=config.keep_every_steps,
                    protected=protected,
                    report=report,
                )
        setup = parts.setup
        self._llmc_sha256 = file_sha256(setup.llmc_file) if setup.llmc_file else ''
        self._versions = library_versions()  # once per run, not per save
        self.last_saved_step = None
        self._last_save_time = time.monotonic()

    def clock_due(self) -> bool:
        minutes = self.config.save_every_minutes
        return minutes > 0 and time.monotonic() - self._last_save_time >= 60 * minutes

    def due(self, step: int, due_by_clock: bool, stopping: bool) -> bool:
        if self.checkpointer is None:
            return False
        if self.events is not None:
            self.events.poll()  # commits and rotations of earlier saves
        save_steps = self.config.save_steps
        scheduled = self.saving and (
            (save_steps > 0 and step % save_steps == 0) or step == self.config.num_iteration or due_by_clock
        )
        return scheduled or stopping

    def save(self, state, step: int, position: int, loss: float | None = None) -> float:
        """Starts an asynchronous save of `state`, which is at (host-side) `step` and data
        `position` (`loss`: the train loss of that step, recorded with it); returns the
        seconds the loop was blocked."""
        began = time.perf_counter()
        config, parts = self.config, self.parts
        record = trainer_state_record(
            config,
            step=step,
            data_position=position,
            epoch=self.stream.epoch_of(position),
            learning_rate=float(parts.schedule(step)),
            model_config=dataclasses.asdict(parts.setup.model_config),
            tokens_per_step=parts.geometry.tokens_per_step,
            topology=parts.topology,
            versions=self._versions,
            llmc_file=parts.setup.llmc_file,
            llmc_sha256=self._llmc_sha256,
            loss=loss,
        )
        opt_state = state.opt_state if config.save_optimizer_state else None
        self.checkpointer.save(step, state.params, opt_state, state.rng, record)
        self.last_saved_step, self._last_save_time = step, time.monotonic()
        blocked = time.perf_counter() - began
        if self.events is not None:
            self.events.started(step, began, blocked)
        return blocked

    def last_good(self):
        """The last good state on disk: this run's last save, else the one it resumed."""
        if self.last_saved_step is not None:
            return self.checkpointer.step_dir(self.last_saved_step)
        return self.resume_dir

    def close(self):
        if self.checkpointer is not None:
            self.checkpointer.close()  # waits for the last write to be committed
            if self.events is not None:
                self.events.poll()
