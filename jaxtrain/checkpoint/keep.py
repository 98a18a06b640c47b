"""What rotation must keep beside its rule (layout.kept_steps): --keep_best's steps and other lineages'.

Best steps. --keep_best N: the N checkpoints with the lowest validation loss are kept out of rotation.

A step's validation loss is the one measured at that step (val_loss_every must reach it) and is
recorded in its trainer state as `val_loss`, in either format's record, so a resumed run and
`ckpt ls` see the same ranking: the N lowest over the steps on disk, ties to the earlier step.
A step without a validation loss never counts as one of the best, and neither does one whose record
fails its digest (trainer_state.py): a hand-edited val_loss must not rank a step best, nor let the
real best be rotated away.

Lineage. Which runs a checkpoint root's steps belong to: a run deletes only what its lineage wrote.

A fresh run starts a lineage (a random id); a resumed run continues the lineage of the step it
resumed from. Every save records it as `lineage` in its trainer-state record (either format's),
which the record's digest covers. Rotation and --keep_best's ranking only ever consider the steps
of the run's own lineage: a step another run wrote into the same --checkpoint_dir (a run resumed
from elsewhere into a root that holds another run's steps) is kept out of rotation, never deleted.
A step whose record names no lineage, or whose record fails its digest, cannot be shown to be the
lineage's, so it is kept too: llm.c run folders record none (their files have no room for it), so a
run saving into one deletes only the steps it saved itself.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from jaxtrain.checkpoint import layout


# --- --keep_best ------------------------------------------------------------------------------


def intact_record(step_dir) -> dict | None:
    """The step's record (either format) when its digest holds and its step is its directory's,
    else None (unreadable, edited, renamed, or written without a digest)."""
    from jaxtrain.checkpoint import registry
    from jaxtrain.checkpoint.trainer_state import digest_problem, step_name_problem
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


# --- lineage ----------------------------------------------------------------------------------

LINEAGE_FIELD = 'lineage'


def new_lineage() -> str:
    """A fresh run's lineage id; every process of a multi-process run takes process 0's, so the
    record any process writes and the rotation any process runs name the same lineage."""
    import jax
    import numpy as np

    token = np.frombuffer(uuid.uuid4().bytes, np.uint32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        token = np.asarray(multihost_utils.broadcast_one_to_all(token), np.uint32)
    return token.astype('<u4').tobytes().hex()


def lineage_of(step_dir) -> str | None:
    """The lineage a step's intact record names, else None."""
    if step_dir is None:
        return None
    record = intact_record(step_dir)
    lineage = (record or {}).get(LINEAGE_FIELD)
    return lineage if isinstance(lineage, str) and lineage else None


def other_lineages_steps(fmt, root, lineage: str) -> list[int]:
    """The committed steps of format `fmt` under root that are not of `lineage` (kept out of rotation)."""
    root = Path(root)
    others = []
    for step in fmt.committed_steps(root):
        path = fmt.step_path(root, step)
        if lineage_of(path) != lineage:
            others.append(step)
    return others
