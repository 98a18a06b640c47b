"""A checkpoint root on disk: step directory names, what "committed" means, what rotation keeps.

`<checkpoint_dir>/checkpoint_step_000040/` is one step. Orbax writes a step under a
temporary name and renames it when every item is written, so a step directory with its
final name and its trainer state is committed; anything else is an unfinished save.
Orbax itself counts any directory with a step's final name as a step, so before a run's
manager opens the root the others are renamed aside (set_aside_uncommitted): from then on
both see the same steps. `<checkpoint_dir>/jaxtrain.lock` is the run that owns the root
(root_access.py).

Which of a root's steps rotation keeps (kept_steps), one rule for every format's checkpointer:
the newest `keep_latest` steps (0 keeps all, as InfiniTrain's max_checkpoint_keep), every
multiple of `keep_every` (--keep_every_steps), and the protected steps: the one the run resumed
from, symbolic links, --keep_best's, and the steps of other lineages (keep.py). The Orbax
manager's preservation policy, the InfiniTrain and llm.c checkpointers' deletions, and the run's
rotation lines (train/saving.py) all ask kept_steps, so they cannot disagree about what a
save deletes. best_steps ranks --keep_best's, for the run and `ckpt ls` alike (keep.py reads the
losses).

Why a checkpoint write failed, and what to do about it, for the one-line save error.

A full disk and a directory the run may not write into need different advice: "free space"
does nothing for permission denied. Orbax raises its own exception types with the OS error's
text inside, so a reason is recognised by its errno where there is one, else by that text.
"""

import math
import re
from pathlib import Path
import errno


STEP_PREFIX = 'checkpoint_step'
STEP_DIGITS = 6
_STEP_DIR = re.compile(rf'^{STEP_PREFIX}_(\d{{{STEP_DIGITS},}})$')
TRAINER_STATE_FILE = Path('trainer_state') / 'metadata'  # where Orbax's JsonSave puts it
UNFINISHED_SAVE = '.orbax-checkpoint-tmp'  # in the name of a step Orbax is still writing
DAMAGED = 'the checkpoint is damaged: resume from an earlier step (python -m jaxtrain.ckpt ls lists them)'


def damaged_advice(step_dir) -> str:
    """DAMAGED for one step directory, naming the committed step before it to resume
    instead (the newest may be the damaged one), and how to continue in its root."""
    step_dir = Path(step_dir)
    step = step_of(step_dir)
    earlier = [s for s in committed_steps(step_dir.parent) if step is None or s < step]
    if not earlier:
        return (
            f'the checkpoint is damaged, and {step_dir.parent} holds no committed step before it: '
            'resume from an earlier step elsewhere (python -m jaxtrain.ckpt ls DIR lists them), or '
            'start without --resume_from'
        )
    return (
        f'the checkpoint is damaged: resume from the step before it, --resume_from '
        f'{step_dir.parent / step_dir_name(earlier[-1])} (in its checkpoint_dir also pass '
        '--config.overwrite_later_checkpoints=true to replace the damaged later steps)'
    )


class CheckpointError(Exception):
    """A problem with a checkpoint or the checkpoint settings; the message is one line."""


def step_dir_name(step: int) -> str:
    return f'{STEP_PREFIX}_{step:0{STEP_DIGITS}d}'


def step_dir_names(steps) -> str:
    """'checkpoint_step_000001, checkpoint_step_000002': the steps as error messages list them."""
    return ', '.join(step_dir_name(s) for s in steps)


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


def later_steps(root, steps, start_step: int, overwrite: bool) -> list[int]:
    """The `steps` of root after start_step, for the caller to delete; refused unless
    overwrite. A run continuing from start_step beside them would leave `latest` naming a
    step of the old run, and Orbax skips saving a step at or below its newest."""
    later = [s for s in steps if s > start_step]
    if later and not overwrite:
        raise CheckpointError(
            f'checkpoint_dir: {Path(root)}: expected no checkpoints after step {start_step}, found '
            f'{step_dir_names(later)}. To continue from step {start_step} here, pass '
            '--config.overwrite_later_checkpoints=true to delete them (e.g. when they are damaged); '
            'to continue from the newest, --resume_from latest; or choose another --checkpoint_dir.'
        )
    return later


SET_ASIDE = '.uncommitted'  # appended to a step directory's name that is not committed


def linked_steps(root) -> list[int]:
    """Steps whose directory in root is a symbolic link. A link is someone's own arrangement
    (a step kept on another disk): jaxtrain reads through it, but never deletes it or what it
    points to, so rotation keeps these steps."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(step_of(p) for p in root.iterdir() if step_of(p) is not None and p.is_symlink())


def refuse_deleting_links(root, steps, why: str) -> None:
    """Before `why` deletes these steps: a CheckpointError when one is a symbolic link."""
    links = [s for s in steps if (Path(root) / step_dir_name(s)).is_symlink()]
    if links:
        path = Path(root) / step_dir_name(links[0])
        raise CheckpointError(
            f'checkpoint_dir: {path}: expected a directory jaxtrain wrote for {why} to delete, found a '
            f'symbolic link to {path.resolve()}; jaxtrain deletes no links: remove it yourself, or choose '
            'another --checkpoint_dir'
        )


def set_aside_uncommitted(root, committed=is_committed) -> list[str]:
    """Renames every directory with a step's final name that is not committed (`committed`;
    by default Orbax's: no trainer state, i.e. emptied, or copied in part) to
    NAME.uncommitted[-N], which neither jaxtrain nor Orbax reads as a step, so that it can
    neither be resumed nor block a save of its step. Nothing is deleted. Returns the new names."""
    root = Path(root)
    if not root.is_dir():
        return []
    moved = []
    for path in sorted(root.iterdir()):
        if step_of(path) is None or not path.is_dir() or committed(path):
            continue
        target, n = path.with_name(path.name + SET_ASIDE), 1
        while target.exists():
            n += 1
            target = path.with_name(f'{path.name}{SET_ASIDE}-{n}')
        path.rename(target)
        moved.append(target.name)
    return moved


# (errnos, the OS's text for them, what to do), most specific first.
_CAUSES = (
    ((errno.ENOSPC, errno.EDQUOT), ('No space left on device', 'Disk quota exceeded'), 'Free space'),
    ((errno.EFBIG,), ('File too large',), 'Free space or use a file system without that file-size limit'),
    (
        (errno.EACCES, errno.EPERM),
        ('Permission denied', 'Operation not permitted'),
        'Make the checkpoint_dir writable by this user, or pass another --checkpoint_dir',
    ),
    ((errno.EROFS,), ('Read-only file system',), 'Pass a --checkpoint_dir on a writable file system'),
)
_OTHER = 'Fix the cause named'


def write_failure(error: BaseException) -> tuple[str, str]:
    """(reason, advice) for a failed write: the OS's reason where it is a known one (else the
    error's own text, shortened) and what to do, without a trailing full stop."""
    text = ' '.join(str(error).split())
    code = getattr(error, 'errno', None)
    for codes, reasons, advice in _CAUSES:
        if code in codes:
            return getattr(error, 'strerror', None) or reasons[0], advice
        found = next((r for r in reasons if r in text), None)
        if found:
            return found, advice
    return (getattr(error, 'strerror', None) or text[:160] or type(error).__name__), _OTHER


def kept_steps(steps, keep_latest: int, keep_every: int, protected=()) -> set[int]:
    """The steps of `steps` that rotation keeps; every other one may be deleted."""
    steps = sorted(steps)
    newest = set(steps[-keep_latest:]) if keep_latest > 0 else set(steps)
    protected = set(protected)
    return {s for s in steps if s in newest or s in protected or (keep_every > 0 and s % keep_every == 0)}


def best_steps(val_losses: dict[int, float], count: int) -> set[int]:
    """--keep_best: the `count` steps with the lowest finite validation loss (ties: the earlier step)."""
    if count <= 0:
        return set()
    finite = {step: loss for step, loss in val_losses.items() if loss is not None and math.isfinite(loss)}
    ranked = sorted((loss, step) for step, loss in finite.items())
    return {step for _, step in ranked[:count]}
