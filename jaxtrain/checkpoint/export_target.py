"""Where `ckpt export` may write, checked before anything is read or written.

An export never replaces what is already at --output unless --force. Even with --force it
never deletes a directory it did not write (an InfiniTrain step directory is replaced only when
its own record says `ckpt export` wrote it, and it holds nothing else; an llm.c run folder's step
only when its jaxtrain_export record vouches for its files, llmc_run/writer.py), never writes into a
checkpoint (the step it reads included, under any name), never over a file of a committed llm.c
step, never over or into what the checkpoint's run started from (--init_from, --llmc_filepath),
and never over the llm.c file a checkpoint records as its base: a LoRA checkpoint is merged and
resumed from that file, and a full one names it as its source.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from jaxtrain.checkpoint.layout import CheckpointError

# The jaxtrain record's key that marks a step directory written by `ckpt export` (its source).
EXPORTED_FROM = 'exported_from'


@dataclasses.dataclass(frozen=True)
class Target:
    """One `ckpt export --format`: the function that writes it, and which of export's flags it takes.

    `writes` is 'module:function', imported once chosen (the command line lists the targets before
    JAX may be imported). The function takes (the source step's format, the parsed arguments) and
    returns (what it wrote, for --json; the lines for people); it reads the steps of any format
    that its source allows, and refuses the others in one line."""

    writes: str
    rank_directories: bool = False  # --ddp, --tp, ... lay the step out as a multi-GPU run's ranks
    hf_folder: bool = False  # a Hugging Face folder: --dtype, --max_shard_size, --check, no --version


_WRITE_INFINITRAIN = 'jaxtrain.checkpoint.formats.infinitrain.export:write'
TARGETS = {
    'llmc': Target('jaxtrain.checkpoint.formats.orbax.export:write_llmc'),
    'hf': Target('jaxtrain.checkpoint.formats.orbax.export:write_hf', hf_folder=True),
    'infinitrain': Target(_WRITE_INFINITRAIN, rank_directories=True),
    'infinitrain-lrs': Target(_WRITE_INFINITRAIN, rank_directories=True),  # HEAD's files
    'infinitrain-bin': Target(_WRITE_INFINITRAIN),
    'llmc-run': Target('jaxtrain.checkpoint.formats.llmc_run.writer:write'),
}


def named(predicate) -> str:
    """'infinitrain or infinitrain-lrs': the --format values whose Target meets `predicate`."""
    return ' or '.join(name for name, target in TARGETS.items() if predicate(target))


def writer(target: str):
    """The function TARGETS names for --format `target`."""
    import importlib

    module, name = TARGETS[target].writes.split(':')
    return getattr(importlib.import_module(module), name)


def topology_from_args(args):
    """The multi-GPU layout export's flags name (llmc_io's Topology), None for one GPU; refused with
    any format but infinitrain, before anything is read."""
    from llmc_io.errors import LLMCFormatError
    from llmc_io.infinitrain.topology import Topology

    topology = Topology(
        ddp=args.ddp,
        tp=args.tp,
        cp=args.cp,
        pp=args.pp,
        vpp=args.vpp,
        sequence_parallel=args.sequence_parallel,
        zero_stage=args.zero_stage,
    )
    if topology == Topology():
        return None
    if not TARGETS[args.format].rank_directories:
        raise CheckpointError(
            f'--ddp/--tp/--cp/--pp/--vpp/--zero_stage/--sequence_parallel: expected only with --format '
            f'{named(lambda t: t.rank_directories)} (HEAD rank directories), found --format {args.format}'
        )
    try:
        topology.validate('export')
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None
    return topology


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_base_file(output, step_dir, recorded_base: str, base: str) -> None:
    """The llm.c file the checkpoint records (and --base, the one standing in for it) is never
    an output, whatever --force says."""
    output = Path(output)
    for name, path in (('records as its base (llmc_file)', recorded_base), ('was given as --base', base)):
        if path and _same_file(output, Path(path)):
            raise CheckpointError(
                f'--output: {output}: expected a new file, found the llm.c file {step_dir} {name}; '
                'writing over it would leave that checkpoint without its base. Choose another --output'
            )


def refuse_output_in_input(output, step_dir) -> None:
    """--output is neither STEP_DIR nor anything inside it, under any name (symlinks resolved)."""
    output, real_input = Path(output).resolve(), Path(step_dir).resolve()
    if output == real_input or real_input in output.parents:
        found = 'a checkpoint: STEP_DIR itself' if output == real_input else 'a path inside that checkpoint'
        raise CheckpointError(
            f'--output: {output}: expected a path outside STEP_DIR {step_dir}, found {found}; '
            'choose another --output'
        )


def refuse_run_sources(output, step_dir) -> None:
    """What the checkpoint's run started from (--init_from, --llmc_filepath, as its record says) is
    never written over or into, --force or not: the HF folder or llm.c file a run was fine-tuned
    from is often the only copy of that model."""
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    if not (Path(step_dir) / 'trainer_state').is_dir():
        return  # not one of our steps: it records no sources
    config = read_trainer_state(step_dir).get('training_config') or {}
    real_output = Path(output).resolve()
    for key in ('init_from', 'llmc_filepath'):
        source = config.get(key) or ''
        if not source or not Path(source).exists():
            continue
        real = Path(source).resolve()
        if real_output == real or real in real_output.parents:
            raise CheckpointError(
                f'--output: {output}: expected a path apart from what the run of {step_dir} started from, '
                f'found {"" if real_output == real else "a path inside "}its --{key} {source}; writing '
                'there would change that model. Choose another --output'
            )


def check_file_output(output, force: bool) -> None:
    from llmc_io.output_file import committed_step_of, step_dir_holding

    output = Path(output)
    holder = step_dir_holding(output)
    if holder is not None:
        raise CheckpointError(
            f'--output: {output}: expected a path outside every checkpoint, found one inside the step '
            f'{holder}; choose another --output'
        )
    if output.is_dir():
        raise CheckpointError(f'--output: {output}: expected a file to write, found a directory; name a file')
    if not output.parent.is_dir():
        raise CheckpointError(
            f'--output: {output}: expected a file in an existing directory, found no {output.parent}'
        )
    step = committed_step_of(output)
    if step is not None and output.exists():
        raise CheckpointError(
            f'--output: {output}: expected a file that is no checkpoint\'s, found a file of the committed '
            f'llm.c step {step} (DONE_{step:08d} beside it); choose another --output'
        )
    if output.exists() and not force:
        raise CheckpointError(
            f'--output: {output}: expected a path that does not exist yet, found a file there; '
            'choose another --output, or pass --force to replace it'
        )


def _is_checkpoint(directory: Path) -> bool:
    """A step directory of any kind, or a root holding one: `--init_from ROOT` reads its newest step,
    and an HF folder written beside the steps would stand in for them."""
    from jaxtrain.checkpoint.formats.infinitrain import steps as it
    from llmc_io.llmc_run import is_run_dir
    from llmc_io.output_file import holds_step_dirs

    return holds_step_dirs(directory) or it.detect_kind(directory) is not None or is_run_dir(directory)


def check_hf_output(output, force: bool) -> None:
    """A folder to create, an empty one, or (with --force) one whose config files and weight files
    (model.safetensors, or shards and their index) are replaced; other files in it are left alone."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise CheckpointError(f'--output: {output}: expected a directory for --format hf, found a file')
    if not output.is_dir() or not any(output.iterdir()):
        return
    if _is_checkpoint(output):
        raise CheckpointError(
            f'--output: {output}: expected a folder for the Hugging Face files, found a checkpoint or a '
            'checkpoint root (--force never writes into one); choose another --output'
        )
    if not force:
        names = ', '.join(sorted(p.name for p in output.iterdir())[:4])
        raise CheckpointError(
            f'--output: {output}: expected a new or empty folder, found one holding {names}; choose '
            'another --output, or pass --force to replace its config and weight files'
        )
    from llmc_io.output_file import foreign_hf_files

    foreign = foreign_hf_files(output)
    if foreign:
        raise CheckpointError(
            f'--output: {output}: expected (with --force) Hugging Face files that an export wrote '
            f'(config.json with llmc_header), found {", ".join(foreign[:4])} of another program; --force '
            'never replaces those: choose another --output'
        )


def check_step_dir_output(output, force: bool) -> bool:
    """True when --output is an earlier export to be replaced (--force); refuses any other
    existing directory."""
    from jaxtrain.checkpoint.formats.infinitrain import steps as it
    from llmc_io.errors import LLMCFormatError
    from llmc_io.infinitrain.state import read_trainer_state

    output = Path(output)
    if not output.exists():
        return False
    if not force:
        raise CheckpointError(
            f'--output: {output}: expected a step directory to create, found one there; choose another '
            '--output, or pass --force to replace an earlier export'
        )
    kind = it.detect_kind(output) if output.is_dir() else None
    record = {}
    if kind is not None:
        try:
            record = read_trainer_state(output / it.TRAINER_STATE).jaxtrain or {}
        except (LLMCFormatError, OSError):
            record = {}
    ours = {it.FILES[kind][0], it.FILES[kind][1], it.TRAINER_STATE} if kind else set()
    if not record.get(EXPORTED_FROM) or any(p.name not in ours for p in output.iterdir()):
        raise CheckpointError(
            f'--output: {output}: expected (with --force) a step directory that ckpt export wrote and '
            'nothing else, found another one (a run\'s checkpoint, or files of yours); it is left as it '
            'is: choose another --output, or move it away yourself'
        )
    return True
