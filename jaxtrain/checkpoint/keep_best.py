"""--keep_best N: the N checkpoints with the lowest validation loss are kept out of rotation.

A step's validation loss is the one measured at that step (val_loss_every must reach it) and is
recorded in its trainer state as `val_loss`, in either format's record, so a resumed run and
`ckpt ls` see the same ranking: the N lowest over the steps on disk, ties to the earlier step.
A step without a validation loss never counts as one of the best.
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


def recorded_val_losses(root) -> dict[int, float]:
    """{step: val_loss} of the step directories under `root` whose record holds one."""
    from jaxtrain.checkpoint import registry
    from llmc_io.errors import LLMCFormatError

    found = {}
    root = Path(root)
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        step = layout.step_of(path)
        if step is None or not path.is_dir():
            continue
        try:
            record = registry.for_step_dir(path).read_record(path)
        except (layout.CheckpointError, LLMCFormatError, OSError, ValueError):
            continue
        loss = record.get('val_loss')
        if isinstance(loss, (int, float)):
            found[step] = float(loss)
    return found
