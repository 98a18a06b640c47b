"""When the loop saves, and what it hands the checkpointer: the save policy of one run.

A step is saved when it is a multiple of save_steps, when save_every_minutes have passed
since the last save, at the last step, and when the run is stopping on a signal.

SaveEvents: the lines a run prints about its checkpoints as they happen: each save as it starts
(how long the loop was blocked), when it is committed on disk (how long the write took),
and each step rotation deleted (and which keep rule let it go).

Saves are written in the background (checkpoint/manager.py, formats/infinitrain/saver.py),
so commits and deletions are found by looking at the checkpoint root: `poll()` lists it (with
the format's own listing of committed steps), and only while something is still to happen (a
save not yet committed, or more steps on disk than the keep rules keep), so a run that is not
saving never touches the disk for it. A synchronous save (llm.c run folders) is committed when
save() returns, so it is looked for at once.
"""

import dataclasses
import time

import jax
import numpy as np

from jaxtrain.checkpoint import ckpt_text, layout, registry
from jaxtrain.checkpoint.keep import recorded_val_losses
from jaxtrain.checkpoint.keep import LINEAGE_FIELD, lineage_of, new_lineage, other_lineages_steps
from jaxtrain.checkpoint.layout import committed_steps, kept_steps, step_dir_name
from jaxtrain.checkpoint.resume_checks import cached_sha256, data_identity, lora_record
from jaxtrain.checkpoint.trainer_state import library_versions, trainer_state_record
from jaxtrain.models.lora import count_parameters
from jaxtrain.optim.optimizer import learning_rate_at
from llmc_io.errors import LLMCFormatError

# A snapshot normally takes milliseconds (a device copy dispatched); longer means it waited for the
# previous save's write, which the save line then says.
WAIT_WORTH_SAYING_S = 0.1


def saved_best_loss(step_dir) -> float | None:
    """The running minimum loss a checkpoint recorded (ours, or InfiniTrain's best_loss), else None."""
    if step_dir is None:
        return None
    try:
        best = registry.for_step_dir(step_dir).read_record(step_dir).get('best_loss')
    except (layout.CheckpointError, LLMCFormatError, OSError):
        return None
    return float(best) if isinstance(best, (int, float)) and np.isfinite(best) else None


class RunSaver:
    """Owns the run's Checkpointer (None without a checkpoint_dir) and remembers the last
    save, which is also the last good state should a later step go non-finite."""

    def __init__(self, config, parts, stream, resume_dir, start_step: int, report=None, record=None):
        """`report`: where the per-save and per-rotation lines go (SaveEvents); `record`: their
        metrics rows."""
        self.config, self.parts, self.stream = config, parts, stream
        self.resume_dir = resume_dir
        self.saving = bool(config.checkpoint_dir) and (config.save_steps > 0 or config.save_every_minutes > 0)
        self.checkpointer = None
        self.deleted_later_steps = []
        self.events = None
        self._snapshot_s = 0.0  # the last snapshot's seconds, said by the save that hands it off
        self._report = report or (lambda line: None)
        self.lineage = lineage_of(resume_dir) or new_lineage()  # recorded by every save (checkpoint/keep.py)
        others = []  # steps of the root that other runs wrote: never rotated away, never ranked
        if config.checkpoint_dir:
            # The checkpoint this run resumed from is never rotated away.
            protected = (
                [layout.step_of(resume_dir)]
                if resume_dir is not None
                # resolve, not absolute: ck/../ck or a symlinked root names the same directory
                and resume_dir.parent.resolve() == layout.Path(config.checkpoint_dir).resolve()
                else []
            )
            fmt = registry.for_flag(config.get('checkpoint_format', registry.ORBAX.name))
            lineages = other_lineages_steps(fmt, config.checkpoint_dir, self.lineage)
            others = [s for s in lineages if s <= start_step]
            protected += others
            if others:
                self._report(
                    f'checkpoint_dir: {config.checkpoint_dir}: steps {others} were not written by this run '
                    'or the runs it resumed from; kept out of rotation (never deleted)'
                )
            self.checkpointer = registry.open_checkpointer(config, parts, protected)
            self.deleted_later_steps = self.checkpointer.refuse_later_steps(
                start_step, config.overwrite_later_checkpoints
            )
            if jax.process_index() == 0:  # the one that prints
                self.events = SaveEvents(
                    self.checkpointer.root,
                    keep_latest=config.max_checkpoint_keep,
                    keep_every=config.keep_every_steps,
                    protected=[*protected, *self.checkpointer.linked],
                    report=report,
                    record=record,
                    list_committed=registry.for_flag(config.checkpoint_format).committed_steps,
                    synchronous=self.checkpointer.synchronous,
                    step_path=self.checkpointer.step_dir,
                )
            if not self.saving:
                self._report(
                    f'checkpoint_dir: {config.checkpoint_dir}: save_steps and save_every_minutes are 0, so '
                    'this run saves no checkpoint there (only a stop by SIGTERM / SIGINT would); pass '
                    '--save_steps N to save every N steps and the last one (a directory this run created is '
                    'removed again if it stays empty)'
                )
        setup = parts.setup
        self._llmc_sha256 = cached_sha256(setup.llmc_file) if setup.llmc_file else ''
        # Checked on resume; reads 16 blocks of 64 KiB per shard, so only when it will be saved.
        self._data = data_identity(stream.paths, built_in=not config.input_bin) if self.checkpointer else None
        self._versions = library_versions()  # once per run, not per save
        self.last_saved_step = None
        self._last_save_time = time.monotonic()
        # Into the trainer state: ckpt ls, and InfiniTrain's best_loss (a running minimum across resumes).
        self.last_loss, self.best_loss = None, saved_best_loss(resume_dir)
        self.last_val = None  # (step, validation loss): recorded by the save at that step
        # --keep_best: the validation losses of the steps on disk, this run's saves added as they come.
        self.val_losses = {}
        if config.keep_best and self.checkpointer is not None:
            on_disk = recorded_val_losses(self.checkpointer.root)
            self.val_losses = {s: v for s, v in on_disk.items() if s <= start_step and s not in others}

    def note_loss(self, loss: float) -> None:
        self.last_loss = loss
        self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)

    def note_val_loss(self, step: int, loss: float) -> None:
        self.last_val = (step, loss)

    def _rank_best(self, step: int) -> None:
        """Records this save's validation loss and keeps the keep_best lowest out of rotation."""
        if self.last_val is not None and self.last_val[0] == step:
            self.val_losses[step] = self.last_val[1]
        if not self.config.keep_best:
            return
        best = layout.best_steps(self.val_losses, self.config.keep_best)
        self.checkpointer.keep_best_steps(best)
        if self.events is not None:
            self.events.best = frozenset(best)

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

    def prepare(self, state) -> str | None:
        """Before step 1: the snapshot's program compiles in the background (Checkpointer.prepare).
        Returns the checkpointer's start line (what it pinned for the saves), or None."""
        if self.saving:
            return self.checkpointer.prepare(*self._saved_parts(state))
        return None

    def snapshot(self, state):
        """The save's first half, which the loop calls before it waits for the step: the state
        copied on the device while the device still runs the step (Checkpointer.snapshot).
        Returns (snapshot, seconds it took), the seconds for the run's metrics."""
        began = time.perf_counter()
        taken = self.checkpointer.snapshot(*self._saved_parts(state))
        self._snapshot_s = time.perf_counter() - began
        if self.events is not None:
            # A snapshot waits for the previous save's write (one at a time): its commit is seen
            # now, when it happened, not after this save's hand-off.
            self.events.poll()
        return taken, self._snapshot_s

    def between_steps(self) -> None:
        """Once an iteration, with only the step just dispatched in flight: a background write's
        copies off the device go now (RunCheckpointer.between_steps)."""
        if self.checkpointer is not None:
            self.checkpointer.between_steps()

    def _saved_parts(self, state):
        """(params, opt_state or None, rng): what a checkpoint of `state` holds."""
        return state.params, state.opt_state if self.config.save_optimizer_state else None, state.rng

    def save(self, snapshot, step: int, position: int) -> float:
        """Starts the asynchronous save of `snapshot` (from snapshot()), a state at (host-side)
        `step` and data `position`; returns the seconds the loop was blocked, with the device
        idle. The loop has read that step's loss (note_loss) before it saves, so the record
        carries it."""
        began = time.perf_counter()
        config, parts = self.config, self.parts
        record = trainer_state_record(
            config,
            step=step,
            data_position=position,
            epoch=self.stream.epoch_of(position),
            learning_rate=learning_rate_at(parts.schedule, step),
            model_config=dataclasses.asdict(parts.setup.model_config),
            tokens_per_step=parts.geometry.tokens_per_step,
            topology=parts.topology,
            versions=self._versions,
            llmc_file=parts.setup.llmc_file,
            llmc_sha256=self._llmc_sha256,
            loss=self.last_loss,
        )
        if parts.setup.lora is not None:  # adapters only: the record names their base (resume_checks.py)
            record['lora'] = lora_record(parts.setup, count_parameters(snapshot.items['params']))
        record['data'] = self._data
        record[LINEAGE_FIELD] = self.lineage
        if self.best_loss is not None:
            record['best_loss'] = self.best_loss
        if self.last_val is not None and self.last_val[0] == step:
            record['val_loss'] = self.last_val[1]
        self._rank_best(step)
        # As InfiniTrain prints it: under --checkpoint_dir as given, named as the format names the step
        # (an llm.c run folder's step is its model file).
        as_given = layout.Path(config.checkpoint_dir) / self.checkpointer.step_dir(step).name
        self._report(ckpt_text.ckpt_save_begin_line(as_given, step))
        self.checkpointer.save_snapshot(step, snapshot, record)
        # InfiniTrain's "done" line: the save is handed off here; SaveEvents says when it is committed.
        self._report(ckpt_text.ckpt_save_done_line(as_given))
        self.last_saved_step, self._last_save_time = step, time.monotonic()
        blocked = time.perf_counter() - began
        if self.events is not None:
            self.events.started(step, began, blocked, waited_s=self._snapshot_s)
        self._snapshot_s = 0.0
        return blocked

    def last_good(self):
        """The last good state on disk: this run's last save, else the one it resumed."""
        if self.last_saved_step is not None:
            return self.checkpointer.step_dir(self.last_saved_step)
        return self.resume_dir

    def abort_notice(self) -> str:
        if self.checkpointer is None:
            return 'nothing is saved (no checkpoint_dir)'
        return self.checkpointer.abort_notice()

    def close(self):
        if self.checkpointer is not None:
            self.checkpointer.close()  # waits for the last write to be committed
            if self.events is not None:
                self.events.poll()


class SaveEvents:
    def __init__(
        self,
        root,
        *,
        keep_latest: int,
        keep_every: int,
        protected=(),
        report=None,
        record=None,
        list_committed=committed_steps,
        synchronous: bool = False,
        step_path=None,
    ):
        """`report` takes the lines; `record` the rows ({'step', 'save_commit_s'}) for metrics;
        `list_committed(root)`: the format's committed steps; `synchronous`: saves are written
        before save() returns; `step_path(step)`: where a step is (default its checkpoint_step_NNNNNN)."""
        self.root = root
        self.step_path = step_path or (lambda step: self.root / step_dir_name(step))
        self.list_committed, self.synchronous = list_committed, synchronous
        self.keep_latest, self.keep_every, self.protected = keep_latest, keep_every, frozenset(protected)
        self.best = frozenset()  # --keep_best's steps, as the saver last ranked them
        self.report = report or (lambda line: None)
        self.record = record or (lambda row: None)
        self._on_disk = set(list_committed(root))
        self._started = {}  # step -> perf_counter when its save began, until it is seen committed
        self.committed = []  # steps this run wrote and saw committed, in order
        self._reported_deleted = set()

    def _kept(self, steps) -> set:
        """What the checkpointer's rotation leaves of `steps` (the same rule, layout.kept_steps)."""
        return kept_steps(steps, self.keep_latest, self.keep_every, self.protected | self.best)

    def started(self, step: int, began: float, blocked_s: float, waited_s: float = 0.0) -> None:
        """A save of `step` began at perf_counter `began` and blocked the loop `blocked_s`, after
        its snapshot waited `waited_s` (for the previous save's write, when saves come faster
        than a write takes)."""
        self._started[step] = began
        how = 'written before the loop went on' if self.synchronous else 'writing in the background'
        blocked = f'loop blocked {blocked_s * 1e3:.1f} ms'
        if waited_s >= WAIT_WORTH_SAYING_S:
            how += f'; its snapshot first waited {waited_s:.2f} s for the previous save to be written'
        self.report(f'save: step {step} -> {self.step_path(step)} ({blocked}; {how})')
        if self.synchronous:
            self.poll()

    def _pending(self) -> bool:
        return bool(self._started) or self._kept(self._on_disk) != self._on_disk

    def poll(self) -> None:
        """Reports what was committed or deleted since the last look (cheap when nothing is pending)."""
        if not self._pending():
            return
        now = set(self.list_committed(self.root))
        # Saves commit in order, and rotation follows a commit: a step of ours that is not
        # on disk while a later one is was committed and rotated away between two looks.
        newest = max(now, default=-1)
        rotated_unseen = {s for s in self._started if s not in now and s < newest}
        for step in sorted((now - self._on_disk) | rotated_unseen):
            if step in self._started:
                seconds = time.perf_counter() - self._started.pop(step)
                self.committed.append(step)
                line = f'save: step {step} committed ({seconds:.2f} s after the save began)'
                if len(self.committed) == 1:
                    line += self._size_note(step)
                self.report(line)
                self.record({'step': step, 'save_commit_s': seconds})
        for step in sorted((self._on_disk | set(self.committed)) - now - self._reported_deleted):
            self._reported_deleted.add(step)
            self.report(f'rotation: deleted {self.step_path(step).name} ({self._why_deleted(step, now)})')
        self._on_disk = now

    def _size_note(self, step: int) -> str:
        """What one checkpoint costs on disk and how many the keep rule holds, said once, at the
        first commit: a run that saves often can fill a disk long before it ends."""
        step_dir = self.step_path(step)
        size = sum(p.stat().st_size for p in step_dir.rglob('*') if p.is_file()) if step_dir.is_dir() else 0
        if not size:  # already rotated away
            return ''
        if self.keep_latest:
            kept = f'max_checkpoint_keep {self.keep_latest} keeps the newest {self.keep_latest}'
        else:
            kept = 'max_checkpoint_keep 0 keeps every one'
        return f'; a checkpoint takes {_size_text(size)} on disk ({kept})'

    def _why_deleted(self, step: int, now: set) -> str:
        if not self.keep_latest:
            return 'not by this run\'s keep rules: max_checkpoint_keep 0 keeps every step'
        newest = ', '.join(str(s) for s in sorted(now)[-self.keep_latest :])
        reason = f'max_checkpoint_keep {self.keep_latest} keeps the newest: {newest}'
        if self.keep_every > 0:
            reason += f'; {step} is not a multiple of keep_every_steps {self.keep_every}'
        if self.best:
            best = ', '.join(map(str, sorted(self.best)))
            reason += f"; not among keep_best's lowest validation losses (steps {best})"
        return reason


def _size_text(num_bytes: int) -> str:
    for unit, scale, digits in (('GiB', 2**30, 2), ('MiB', 2**20, 1)):
        if num_bytes >= scale:
            return f'{num_bytes / scale:.{digits}f} {unit}'
    return f'{num_bytes / 2**10:.0f} KiB'
