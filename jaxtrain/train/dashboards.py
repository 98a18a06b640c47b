"""TensorBoard and Weights & Biases: the run's metrics as curves, beside metrics.jsonl.

`--tensorboard_dir DIR` writes TensorBoard event files with tensorboardX (as MaxText does);
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
"""

from __future__ import annotations

import json

from jaxtrain.train.output_directory import create_output_directory

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


class Dashboards:
    """The writers a run asked for; `record(row)` for every run-log row, `close()` at the end."""

    def __init__(self, config, first_step: int, is_main: bool = True):
        self.tensorboard = self.wandb_run = None
        self.first_step = first_step
        if not is_main:
            return
        if config.tensorboard_dir:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise _missing('--tensorboard_dir', 'tensorboardX') from None
            # A fresh run purges nothing; a resumed one hides what an earlier run wrote after its step.
            purge = first_step + 1 if first_step > 0 else None
            create_output_directory('tensorboard_dir', config.tensorboard_dir)
            self.tensorboard = SummaryWriter(config.tensorboard_dir, purge_step=purge, flush_secs=30)
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
            self.tensorboard.add_text('config', config_markdown(record), global_step=self.first_step)
        if self.wandb_run is not None:
            self.wandb_run.config.update(record, allow_val_change=True)

    def record(self, row: dict) -> None:
        step = row.get('step')
        if step is None:
            return
        scalars = scalars_of(row)
        if not scalars:
            return
        if self.tensorboard is not None:
            for tag, value in scalars.items():
                self.tensorboard.add_scalar(tag, value, global_step=step)
        if self.wandb_run is not None:
            self.wandb_run.log({WANDB_STEP: step, **scalars})

    def close(self, failed: bool = False) -> None:
        """`failed`: the run is ending on an exception; W&B marks the run failed (exit code 1)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=1 if failed else 0)
