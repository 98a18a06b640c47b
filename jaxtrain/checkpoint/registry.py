"""Which checkpoint format (format.py) a flag or a step directory means.

`--checkpoint_format` picks the format a run writes (`for_flag`); a step directory's files
pick the format it is read with (`for_step_dir`): the first of READERS that owns it (an llm.c
run folder's step, an InfiniTrain kind's), else ours, last, whose checks then say what is
wrong with it. A new format implements format.CheckpointFormat and is listed here; nothing
else needs to know it.
"""

from pathlib import Path

from jaxtrain.checkpoint.format import CheckpointFormat, RunCheckpointer, Verification, refuse_problems
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.format import InfiniTrainFormat
from jaxtrain.checkpoint.formats.llmc_run.restore import LLMCRunFormat
from jaxtrain.checkpoint.formats.orbax.restore import OrbaxFormat
from jaxtrain.checkpoint.layout import CheckpointError, step_dir_name

ORBAX = OrbaxFormat()
LLMC_RUN = LLMCRunFormat()  # llm.c run folders: model_%08d.bin, state_%08d_00000.bin, DONE_%08d
# InfiniTrain's format, by generation: what each one holds and whether a run saves it is steps.py's
# GENERATIONS, so nothing here names one.
_INFINITRAIN = {generation.name: InfiniTrainFormat(generation) for generation in it.GENERATIONS}
# --checkpoint_format values, in the order --help lists them.
WRITERS: dict[str, CheckpointFormat] = {
    ORBAX.name: ORBAX,
    **{name: fmt for name, fmt in _INFINITRAIN.items() if fmt.generation.saved_by_runs},
    LLMC_RUN.name: LLMC_RUN,
}
FORMAT_NAMES = tuple(WRITERS)
# The formats a step directory is offered to, in order: Orbax last, the fallback whose checks say
# what is wrong with a directory no format owns. A generation that shares another's files (PR 151's
# scheduler generation, HEAD's files) is HEAD's to read.
READERS: tuple[CheckpointFormat, ...] = (
    LLMC_RUN,
    *(fmt for name, fmt in _INFINITRAIN.items() if fmt.generation.files == name),
    ORBAX,
)
_FAMILIES = (
    ORBAX,
    _INFINITRAIN[it.HEAD_KIND],
    LLMC_RUN,
)  # one of each kind of root, for the mixed-root check


def for_flag(name: str) -> CheckpointFormat:
    """The format --checkpoint_format `name` writes (checks/config_checks.py has refused any other)."""
    return WRITERS[name]


def for_step_dir(step_dir) -> CheckpointFormat:
    """The first of READERS that owns step_dir; Orbax when none does (its checks say what is wrong).
    A format may refuse a step of its own it cannot read as it is (format.CheckpointFormat.owns)."""
    return next((fmt for fmt in READERS[:-1] if fmt.owns(step_dir)), READERS[-1])


def ls(root, validation) -> tuple[CheckpointFormat, dict]:
    """`ckpt ls ROOT`: (the format that lists it, its listing). A folder one format lays out alone (an
    llm.c run folder, which it owns) is its own; a root of checkpoint_step_NNNNNN directories falls
    to Orbax, which lists every one, taking each other format's rows (ls_rows) for those it claims.
    `validation`: format.CheckpointFormat.ls's."""
    fmt = for_step_dir(root)
    rows = [row for other in READERS[:-1] for row in other.ls_rows(root)]
    return fmt, fmt.ls(root, rows, validation)


def verify(path) -> Verification:
    """The verification of the checkpoint at `path` by its format (format.CheckpointFormat.verify):
    a step directory, an InfiniTrain step directory or an llm.c run folder / model file. An llm.c
    step that is not committed or not whole raises CheckpointError instead."""
    return for_step_dir(path).verify(path)


def refuse_damaged(path, flag: str) -> Verification:
    """verify(path), raising its first problem as one CheckpointError line (which file, and what
    to do) when there is one: what every way into a checkpoint calls before it reads one.
    `flag` names the way in ('resume_from', 'init_from', 'generate', 'ckpt export')."""
    return refuse_problems(verify(path), path, flag)


def newest_step(root) -> tuple[Path, CheckpointFormat] | None:
    """(the newest committed step of any kind under root, its format), or None when it holds none.
    A step an llm.c run folder names is its model file, as --resume_from takes it."""
    found = [(steps[-1], fmt) for fmt in _FAMILIES if (steps := fmt.committed_steps(root))]
    if not found:
        return None
    step, fmt = max(found, key=lambda pair: pair[0])
    path = fmt.step_path(root, step)
    return path, for_step_dir(path)  # the kind: InfiniTrain's HEAD or PR files


def refuse_other_kind_for_latest(root, fmt: CheckpointFormat) -> None:
    """--resume_from latest found no committed step of fmt's kind in root: when root holds another
    kind, one line naming it and the flag that resumes it (rather than starting fresh, and then
    refusing the mixed root)."""
    found = newest_step(root)
    if found is None:
        return
    step, other = found
    use = f'--checkpoint_format {other.name}' if other.name in WRITERS else f'--resume_from {step}'
    raise CheckpointError(
        f'resume_from: latest: {Path(root).absolute()}: expected {fmt.name} checkpoints '
        f'(--checkpoint_format {fmt.name}), found {other.title} ones ({Path(step).name}); pass {use}'
    )


def open_checkpointer(config, parts, protected_steps) -> RunCheckpointer:
    """The run's checkpointer for config.checkpoint_format, refusing a root that holds the other kind:
    Orbax's rotation would count (and delete) InfiniTrain step directories as its own, and ours would
    skip Orbax steps."""
    fmt = for_flag(config.get('checkpoint_format', ORBAX.name))
    root = Path(config.checkpoint_dir)
    for other in _FAMILIES:
        found = other.committed_steps(root) if other.title != fmt.title else []
        if found:
            raise CheckpointError(
                f'checkpoint_dir: {root.absolute()}: expected only {fmt.name} checkpoints, found '
                f'{other.title} ones ({step_dir_name(found[0])}); '
                'keep each kind in its own --checkpoint_dir (resuming from the other root is fine)'
            )
    return fmt.open(config, parts, protected_steps)
