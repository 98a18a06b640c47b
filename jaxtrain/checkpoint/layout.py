"""A checkpoint root on disk: step directory names, and what "committed" means.

`<checkpoint_dir>/checkpoint_step_000040/` is one step. Orbax writes a step under a
temporary name and renames it when every item is written, so a step directory with its
final name and its trainer state is committed; anything else is an unfinished save.
"""

import re
from pathlib import Path

STEP_PREFIX = 'checkpoint_step'
STEP_DIGITS = 6
_STEP_DIR = re.compile(rf'^{STEP_PREFIX}_(\d{{{STEP_DIGITS},}})$')
TRAINER_STATE_FILE = Path('trainer_state') / 'metadata'  # where Orbax's JsonSave puts it
UNFINISHED_SAVE = '.orbax-checkpoint-tmp'  # in the name of a step Orbax is still writing
DAMAGED = 'the checkpoint is damaged: resume from an earlier step (python -m jaxtrain.ckpt ls lists them)'


class CheckpointError(Exception):
    """A problem with a checkpoint or the checkpoint settings; the message is one line."""


def step_dir_name(step: int) -> str:
    return f'{STEP_PREFIX}_{step:0{STEP_DIGITS}d}'


def step_of(step_dir: Path) -> int | None:
    match = _STEP_DIR.match(Path(step_dir).name)
    return int(match.group(1)) if match else None


def is_committed(step_dir: Path) -> bool:
    """A finished Orbax step: final name (not a tmp name) and its trainer state present."""
    return step_of(step_dir) is not None and (Path(step_dir) / TRAINER_STATE_FILE).is_file()


def committed_steps(root) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(step_of(p) for p in root.iterdir() if p.is_dir() and is_committed(p))


