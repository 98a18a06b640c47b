"""Which runs a checkpoint root's steps belong to: a run deletes only what its lineage wrote.

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
    from jaxtrain.checkpoint.keep_best import intact_record

    if step_dir is None:
        return None
    record = intact_record(step_dir)
    lineage = (record or {}).get(LINEAGE_FIELD)
    return lineage if isinstance(lineage, str) and lineage else None


def other_lineages_steps(fmt, root, lineage: str) -> list[int]:
    """The committed steps of format `fmt` under root that are not of `lineage` (kept out of rotation)."""
    from jaxtrain.checkpoint.layout import step_dir_name

    root = Path(root)
    others = []
    for step in fmt.committed_steps(root):
        path = fmt.step_path(root, step) if hasattr(fmt, 'step_path') else root / step_dir_name(step)
        if lineage_of(path) != lineage:
            others.append(step)
    return others
