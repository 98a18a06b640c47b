"""The seam between the run and a checkpoint format: what every format implements.

A `CheckpointFormat` knows one kind of step directory on disk: which steps a root holds,
how to open a checkpointer that saves a run into a root, how to read a step's record, and
how to restore a step into the run's state. The `RunCheckpointer` it opens is what the
save policy (train/saving.py) drives. registry.py maps `--checkpoint_format` and a step
directory's kind to the format; resume.py and the save policy ask the registry, so no
format module needs either of them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

import jax
import numpy as np
import optax

from jaxtrain.checkpoint.layout import CheckpointError


@dataclasses.dataclass
class Resumed:
    """What a restore gives the loop: the state to train from, the step directory it came
    from (None for a fresh start), its trainer-state record, and the lines to log."""

    state: object
    step_dir: Path | None
    record: dict | None
    messages: list


@dataclasses.dataclass
class Verification:
    """What a format's verify found: one line per problem (each naming its file), and what was
    found good, for `ckpt verify`'s report. No problems: the checkpoint is intact."""

    problems: list[str]
    checked: list[str]


@dataclasses.dataclass
class Weights:
    """A step's model weights alone, as --init_from and generate take them: the family, the params
    as a NumPy tree, what they are (for messages), the model config's fields where the files say
    them (a record's model_config, an llm.c header's fields; None where only the tensors are
    known), and the step's trainer-state record (None where there is none)."""

    family: str
    params: dict
    what: str
    model_config: dict | None
    record: dict | None = None


@dataclasses.dataclass
class Snapshot:
    """What a RunCheckpointer's snapshot() took (manager.py's, the InfiniTrain and llm.c savers'):
    the state's arrays (a device copy when `copied`, else the live ones) and, when copied, their
    stacked checksums (dispatched, not read)."""

    items: dict
    sums_Nx2: object
    copied: bool


def refuse_problems(result: Verification, path, flag: str) -> Verification:
    """The result when it found nothing; else its first problem as one CheckpointError line, which
    names the file, and what to do. `flag`: the way in ('resume_from', 'init_from', ...)."""
    if result.problems:
        more = len(result.problems) - 1
        listed = f' ({more} more problem{"s" if more > 1 else ""})' if more else ''
        raise CheckpointError(
            f'{flag}: {result.problems[0]}{listed}. Pass an intact checkpoint instead; python -m '
            f'jaxtrain.ckpt verify {path} lists every problem, python -m jaxtrain.ckpt ls the other steps.'
        )
    return result


class RunCheckpointer(Protocol):
    """The saves of one run into one checkpoint root.

    A save is split in two so the loop can dispatch the device copy before it waits for the
    step's metrics: snapshot() takes the state, save_snapshot() writes it (or starts writing
    it); save() is both. wait() returns once every started save is committed."""

    root: Path
    set_aside: list  # uncommitted step directories moved out of the way when the root was opened
    linked: list  # steps whose directory is a symbolic link: kept out of rotation, never deleted
    blocking_saves: int  # saves that held up the loop until written or handed off
    synchronous: bool  # save() returns only once the step is committed (no background write)

    def step_dir(self, step: int) -> Path: ...

    def refuse_later_steps(self, start_step: int, overwrite: bool) -> list[int]:
        """Refuses (or, with overwrite, deletes and returns) the steps after start_step."""
        ...

    def prepare(self, params, opt_state, rng) -> str | None:
        """Before step 1: readies the first save; returns a line for the run's start lines, or None."""
        ...

    def snapshot(self, params, opt_state, rng): ...

    def save_snapshot(self, step: int, snapshot, trainer_state: dict) -> None: ...

    def save(self, step: int, params, opt_state, rng, trainer_state: dict) -> None: ...

    def between_steps(self) -> None:
        """Called by the loop once an iteration, after any read of a step's metrics, with only the
        step it just dispatched in flight: where a background write's copies off the device wait
        for nothing (a no-op for a checkpointer whose copies are made otherwise)."""
        ...

    def keep_best_steps(self, steps) -> None:
        """--keep_best: these steps are kept out of rotation from the next save on (replacing the
        last set)."""
        ...

    def wait(self) -> None: ...

    def abort_notice(self) -> str:
        """For a run aborted at once: what is saved and what is lost."""
        ...

    def close(self) -> None: ...


class CheckpointFormat(Protocol):
    """One kind of step directory (`checkpoint_step_NNNNNN`, layout.py) and how a run uses it."""

    name: str  # the --checkpoint_format value that writes it (or the kind `ckpt ls` prints)
    title: str  # the family, as messages name it: 'Orbax', 'InfiniTrain'
    # Why its steps cannot record the validation loss --keep_best ranks them by ('' where they do).
    no_val_loss: str

    def owns(self, step_dir) -> bool:
        """Whether step_dir is a step directory of this format."""
        ...

    def committed_steps(self, root) -> list[int]:
        """The steps of this format committed under root, oldest first."""
        ...

    def step_path(self, root, step: int) -> Path:
        """Where committed step `step` under root is, as every way in takes it: its
        checkpoint_step_NNNNNN directory, or an llm.c run folder's model file."""
        ...

    def open(self, config, parts, protected_steps) -> RunCheckpointer:
        """The run's checkpointer for config.checkpoint_dir; protected steps are never rotated away."""
        ...

    def read_record(self, step_dir) -> dict:
        """The step's trainer-state record (step, best_loss, ...), without touching its arrays."""
        ...

    def verify(self, path) -> Verification:
        """Every check this format knows, on every file of the step (copies a restore does not
        read included), without a run: what `ckpt verify` reports and every way in (resume,
        --init_from, generate, export) refuses on. Never raises for a damaged checkpoint."""
        ...

    def read_weights(self, step_dir) -> Weights:
        """The step's model weights on the host, without a run (--init_from, generate)."""
        ...

    def resume_step(self, path: Path) -> Path:
        """The step `--resume_from PATH` (absolute, a path this format owns, or one none owns for
        Orbax) resumes from, or a CheckpointError saying what PATH is instead and what to pass."""
        ...

    def restore_into(self, config, parts, step_dir: Path) -> Resumed:
        """Checks step_dir against the run (everything, before the state is touched) and
        restores it onto the run's shardings. `parts` is train/setup.py's TrainerSetup."""
        ...

    # What `ckpt ls|show|diff|verify|export` ask (tools/ckpt_commands.py), which never names a kind.

    def find_step(self, path, finished: bool = True) -> Path:
        """The step a `ckpt` command given `path` reads, or a CheckpointError saying what `path` is
        instead (nothing, a root); finished=False takes a save that never finished too (verify)."""
        ...

    def ls_rows(self, root) -> list[dict]:
        """`ckpt ls`'s rows of this format's checkpoint_step_NNNNNN directories under root (path,
        step, kind, committed, status, ...), which formats share; [] when it keeps its steps otherwise."""
        ...

    def ls(self, root, rows: list[dict], validation) -> dict:
        """`ckpt ls ROOT --json` when registry.for_step_dir(root) is this format: its own folder's
        steps, or the step directories of every format (`rows`, their ls_rows), with the latest and
        --keep_best's steps; `validation(step_dir)` gives a committed step's val_loss, keep_best
        and lineage (keep.py, which a format may not import)."""
        ...

    def ls_text(self, listed: dict) -> str:
        """ls's listing for people."""
        ...

    def show(self, step_dir, with_tensors: bool) -> dict:
        """`ckpt show --json`: the step's record and files (with_tensors: every tensor's statistics)."""
        ...

    def show_text(self, shown: dict, show_all: bool) -> str:
        """show's dict for people (show_all: every training config key, not only those set)."""
        ...

    def diff_view(self, step_dir, common: bool) -> tuple[dict, dict]:
        """(the record `ckpt diff` compares, {item: {tensor name: array}, or None where not saved}).
        common: params and Adam's moments under the names every format shares (item ''), for a
        diff across formats; else the format's own items."""
        ...

    def refuse_as_source(self, path, command: str, target: str = '') -> None:
        """Raises a CheckpointError when `command` (`ckpt diff`, `ckpt export --format target`) does
        not read this format's steps, saying what does (an llm.c run folder converts with llmc_io)."""
        ...


def set_schedule_position(opt_state, step: int):
    """Fresh optimizer moments, but the learning-rate schedule continues at `step`."""
    is_schedule = lambda s: isinstance(s, optax.ScaleByScheduleState)
    return jax.tree.map(
        lambda s: optax.ScaleByScheduleState(count=np.asarray(step, np.int32)) if is_schedule(s) else s,
        opt_state,
        is_leaf=is_schedule,
    )


def fresh_optimizer_state(parts, params, step: int):
    """For a step saved without optimizer state: new moments on the run's shardings, the
    learning-rate schedule at `step`."""
    fresh = lambda p: set_schedule_position(parts.tx.init(p), step)
    return jax.jit(fresh, out_shardings=parts.opt_shardings)(params)
