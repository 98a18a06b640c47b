"""Which of a root's steps rotation keeps: one rule for every format's checkpointer.

The newest `keep_latest` steps (0 keeps all, as InfiniTrain's max_checkpoint_keep), every multiple of
`keep_every` (--keep_every_steps), and the protected steps: the one the run resumed from, symbolic
links, --keep_best's, and the steps of other lineages (keep.py). The Orbax manager's preservation
policy, the InfiniTrain and llm.c checkpointers' deletions, and the run's rotation lines
(train/save_events.py) all ask kept_steps, so they cannot disagree about what a save deletes.
"""

from __future__ import annotations


def kept_steps(steps, keep_latest: int, keep_every: int, protected=()) -> set[int]:
    """The steps of `steps` that rotation keeps; every other one may be deleted."""
    steps = sorted(steps)
    newest = set(steps[-keep_latest:]) if keep_latest > 0 else set(steps)
    protected = set(protected)
    return {s for s in steps if s in newest or s in protected or (keep_every > 0 and s % keep_every == 0)}
