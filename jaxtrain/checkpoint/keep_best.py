"""--keep_best N: the N checkpoints with the lowest validation loss are kept out of rotation.

A step's validation loss is the one measured at that step (val_loss_every must reach it) and is
recorded in its trainer state as `val_loss`, in either format's record, so a resumed run and
`ckpt ls` see the same ranking: the N lowest over the steps on disk, ties to the earlier step.
A step without a validation loss never counts as one of the best, and neither does one whose record
fails its digest (record_digest.py): a hand-edited val_loss must not rank a step best, nor let the
real best be rotated away.
"""

from __future__ import annotations

import math
from pathlib import Path

from jaxtrain.checkpoint import layout


def best_steps(val_losses: dict[int, float], count: int) -> set[int]:
    """The `count` steps with the lowest finite validation loss (ties: the earlier step)."""
    if count <= 0:
        return set()
    finite = {step: loss for step, loss in val_losses.items() if loss is not None and math.isfinite(loss)}
    ranked = sorted((loss, step) for step, loss in finite.items())
    return {step for _, step in ranked[:count]}


def intact_record(step_dir) -> dict | None:
    """The step's record (either format) when its digest holds and its step is its directory's,
    else None (unreadable, edited, renamed, or written without a digest)."""
    from jaxtrain.checkpoint import registry
    from jaxtrain.checkpoint.record_digest import digest_problem, step_name_problem
    from llmc_io.errors import LLMCFormatError

    try:
        record = registry.for_step_dir(step_dir).read_record(step_dir)
    except (layout.CheckpointError, LLMCFormatError, OSError, ValueError):
        return None
    if not isinstance(record, dict) or digest_problem(record, step_dir):
        return None
    return None if step_name_problem(record.get('step'), step_dir) else record


def recorded_val_losses(root) -> dict[int, float]:
    """{step: val_loss} of the step directories under `root` whose intact record holds one."""
    found = {}
    root = Path(root)
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        step = layout.step_of(path)
        if step is None or not path.is_dir():
            continue
        record = intact_record(path)
        if record is None:
            continue
        loss = record.get('val_loss')
        if isinstance(loss, (int, float)):
            found[step] = float(loss)
    return found
