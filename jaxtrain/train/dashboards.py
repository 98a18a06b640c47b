"""TensorBoard and Weights & Biases: the run's metrics as curves, beside metrics.jsonl.

`--tensorboard_dir DIR` writes TensorBoard event files with tensorboardX's record writer and
summaries (as MaxText does), in the loop's own thread (TensorBoardEvents);
`--wandb_project NAME` logs the same to W&B (`pip install wandb`; `WANDB_MODE=offline` keeps it
on disk). Every numeric field of the rows the run log records (RunLog.record) becomes a scalar
at the row's step, under the tag SCALAR_TAGS gives it; the resolved run (banner.run_record, what
config.json beside metrics.jsonl holds) is written once as text, and is W&B's run config.

A resumed run appends to the same directory without duplicating steps: its writer starts with
TensorBoard's purge marker at the first step it will write (tensorboardX's purge_step, a
SessionLog START event), so readers drop what an earlier, interrupted run wrote from that step
on. Only process 0 writes.

W&B keeps its own step, which only rises: a row for an earlier step (a checkpoint's commit time
arrives after later steps were logged) would be dropped. So every W&B row carries the training
step as the metric `step`, the x-axis of every tag (define_metric), and W&B's own step just counts
rows. A resumed run is a new W&B run unless WANDB_RUN_ID and WANDB_RESUME=allow name the old one;
either way its curves continue from its first step.

A write that fails raises run_log.RecordWriteError naming the file (or the W&B run) and the step;
the loop ends the run on it (docs/dashboards.md).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time

from jaxtrain.train.run_log import create_output_directory
from jaxtrain.train.run_log import row_of, write_failure

# Row key -> dashboard tag.
SCALAR_TAGS = {
    'loss': 'train/loss',
    'val_loss': 'val/loss',
    'lr': 'train/lr',
    'grad_norm': 'train/grad_norm',
    'tokens_per_s': 'perf/tokens_per_s',
    'mfu': 'perf/mfu',
    'step_ms': 'perf/step_ms',
    'sample_s': 'perf/sample_s',
    'save_blocked_s': 'checkpoint/save_blocked_s',
    'save_snapshot_s': 'checkpoint/save_snapshot_s',
    'save_commit_s': 'checkpoint/save_commit_s',
    'restore_s': 'checkpoint/restore_s',
}

# The W&B metric holding the training step, every tag's x-axis (module docstring).
WANDB_STEP = 'step'


def scalars_of(row: dict) -> dict[str, float]:
    """{tag: value} of a run-log row's numeric fields that have a tag."""
    return {
        SCALAR_TAGS[key]: float(value)
        for key, value in row.items()
        if key in SCALAR_TAGS and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def config_markdown(record: dict) -> str:
    """The run record as a Markdown code block (TensorBoard's text tab renders Markdown)."""
    text = json.dumps(record, indent=2, default=str)
    return '\n'.join('    ' + line for line in text.splitlines())


def _missing(flag: str, package: str, alternative: str = '') -> ImportError:
    also = f' (or {alternative})' if alternative else ''
    return ImportError(
        f'{flag}: expected the {package} package, found it not installed; pip install {package}{also}'
    )


class TensorBoardEvents:
    """One TensorBoard event file, written in the caller's thread. tensorboardX's SummaryWriter
    writes from a thread of its own through a bounded queue: when a write there fails (a full
    disk), that thread dies and the next add blocks forever on the full queue, a SIGTERM
    included. Here a failed write raises where it was made. The file is named and begun as
    tensorboardX names and begins it, purge marker included; it is flushed (and fsynced) every
    `flush_secs` and on close, as SummaryWriter's thread does."""

    def __init__(self, directory, purge_step: int | None, flush_secs: float = 30):
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.record_writer import RecordWriter

        # tensorboardX's name, and this process's id: a run resumed within the second (or another
        # run writing to the same directory) must not truncate an earlier file of the same name.
        name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}'
        self.path = next(
            path
            for n in itertools.count()
            if not os.path.exists(path := os.path.join(directory, name + (f'.{n}' if n else '')))
        )
        self._event = Event
        self.flush_secs, self._flushed = flush_secs, time.monotonic()
        self._file = RecordWriter(self.path)
        self._write(Event(wall_time=time.time(), file_version='brain.Event:2'))
        if purge_step is not None:  # readers drop what earlier runs wrote from this step on
            self._write(Event(step=purge_step, file_version='brain.Event:2'))
            self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _write(self, event) -> None:
        if not event.wall_time:
            event.wall_time = time.time()
        self._file.write(event.SerializeToString())

    def add_summary(self, summary, step: int) -> None:
        self._write(self._event(summary=summary, step=int(step)))
        if time.monotonic() - self._flushed >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Closes the file without flushing what a failed write left in its buffer."""
        try:
            self._file.close()
        except OSError:
            pass  # the buffer's flush failed again


class Dashboards:
    """The writers a run asked for; `record(row)` for every run-log row, `close()` at the end."""

    def __init__(self, config, first_step: int, is_main: bool = True):
        self.tensorboard = self.wandb_run = None
        self.first_step = first_step
        if not is_main:
            return
        if config.tensorboard_dir:
            try:
                import tensorboardX  # noqa: F401
            except ImportError:
                raise _missing('--tensorboard_dir', 'tensorboardX') from None
            # A fresh run purges nothing; a resumed one hides what an earlier run wrote after its step.
            purge = first_step + 1 if first_step > 0 else None
            create_output_directory('tensorboard_dir', config.tensorboard_dir)
            self.tensorboard = TensorBoardEvents(config.tensorboard_dir, purge)
        if config.wandb_project:
            try:
                import wandb
            except ImportError:
                raise _missing('--wandb_project', 'wandb', "pip install 'jaxtrain[wandb]'") from None
            self.wandb_run = wandb.init(
                project=config.wandb_project, dir=config.tensorboard_dir or config.metrics_dir or None
            )
            self.wandb_run.define_metric(WANDB_STEP)
            self.wandb_run.define_metric('*', step_metric=WANDB_STEP)

    def write_config(self, record: dict) -> None:
        if self.tensorboard is not None:
            from tensorboardX.summary import text

            try:
                self.tensorboard.add_summary(text('config', config_markdown(record)), self.first_step)
            except OSError as error:
                raise write_failure(self.tensorboard.path, 'the run config', error) from None
        if self.wandb_run is not None:
            try:
                self.wandb_run.config.update(record, allow_val_change=True)
            except Exception as error:  # whatever wandb raises: one line, the run ends (loop.py)
                raise write_failure(self._wandb_name(), 'the run config', error) from None

    def record(self, row: dict) -> None:
        step = row.get('step')
        if step is None:
            return
        scalars = scalars_of(row)
        if not scalars:
            return
        if self.tensorboard is not None:
            from tensorboardX.summary import scalar

            try:
                for tag, value in scalars.items():
                    self.tensorboard.add_summary(scalar(tag, value), step)
            except OSError as error:
                raise write_failure(self.tensorboard.path, row_of(step), error) from None
        if self.wandb_run is not None:
            try:
                self.wandb_run.log({WANDB_STEP: step, **scalars})
            except Exception as error:  # whatever wandb raises: one line, the run ends (loop.py)
                raise write_failure(self._wandb_name(), row_of(step), error) from None

    def _wandb_name(self) -> str:
        return f'W&B run {getattr(self.wandb_run, "dir", None) or self.wandb_run}'

    def close(self, failed: bool = False, after_error: bool = False) -> None:
        """`failed`: the run is ending on an exception; W&B marks the run failed (exit code 1).
        `after_error`: a write failed (RecordWriteError); the event file is closed without the
        flush that would fail again. A close that fails ends the run (loop.py) too."""
        tensorboard, self.tensorboard = self.tensorboard, None
        wandb_run, self.wandb_run = self.wandb_run, None
        try:
            if tensorboard is not None and after_error:
                tensorboard.abandon()
            elif tensorboard is not None:
                try:
                    tensorboard.close()
                except OSError as error:
                    raise write_failure(tensorboard.path, 'its last rows', error) from None
        finally:
            if wandb_run is not None:
                wandb_run.finish(exit_code=1 if failed else 0)
