"""Resuming: which step directory to resume from, and `resume_into`, the one call the
training loop makes; the step's format (registry.py) checks and restores it.

Resume order: an explicit `resume_from` step directory, or `latest` (the newest committed
step in checkpoint_dir), else the llm.c file the run was given, else random init (the
last two are model setup's, models/setup.py).

Topology: arrays are saved sharded as they live on the mesh and restored onto the current
run's shardings whatever the saving mesh was (8 devices -> 1, 1 -> 8, FSDP -> data
parallel); the resume line names what changed.
"""

from pathlib import Path

from jaxtrain.checkpoint import registry
from jaxtrain.checkpoint.format import Resumed
from jaxtrain.checkpoint.layout import (
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    UNFINISHED_SAVE,
    CheckpointError,
    committed_steps,
    is_committed,
    step_dir_name,
    step_dir_names,
    step_of,
)


def resolve_resume(
    resume_from: str, checkpoint_dir: str, checkpoint_format: str = registry.ORBAX.name
) -> tuple[Path | None, str]:
    """Returns (step directory or None, a notice for the log). `latest` is the newest step
    of checkpoint_format's kind; an explicit step directory may be of any kind."""
    if not resume_from:
        return None, ''
    if resume_from == 'latest':
        if not checkpoint_dir:
            raise CheckpointError(
                "resume_from: 'latest' needs checkpoint_dir; found checkpoint_dir empty. "
                'Pass --checkpoint_dir DIR.'
            )
        fmt = registry.for_flag(checkpoint_format)
        steps = fmt.committed_steps(checkpoint_dir)
        if not steps:
            registry.refuse_other_kind_for_latest(checkpoint_dir, fmt)
            return None, f'resume_from=latest: no committed checkpoint in {checkpoint_dir}; starting fresh'
        # Absolute: Orbax refuses relative paths, and the README's commands use them.
        return Path(fmt.step_path(checkpoint_dir, steps[-1])).absolute(), ''
    path = Path(resume_from).absolute()
    if registry.for_step_dir(path) is not registry.ORBAX:
        return path, ''
    if not path.exists():
        steps = committed_steps(path.parent)
        pick = (  # the way forward: the steps that are there
            f'{path.parent} holds {step_dir_names(steps)}; pass one of them, or '
            f'--checkpoint_dir {path.parent} --resume_from latest'
            if steps
            else f'{path.parent} holds no committed checkpoint'
        )
        raise CheckpointError(
            f'resume_from: {path}: expected a {STEP_PREFIX}_NNNNNN directory, found nothing there. {pick}.'
        )
    if UNFINISHED_SAVE in path.name:
        steps = committed_steps(path.parent)
        pick = (
            f'Pick a committed step instead: {step_dir_names(steps)}'
            if steps
            else f'{path.parent} holds no committed step to pick instead'
        )
        raise CheckpointError(
            f'resume_from: {path}: expected a committed checkpoint, found an unfinished save (the '
            f'temporary name Orbax writes under until a save completes). {pick}.'
        )
    if step_of(path) is not None:
        if not is_committed(path):
            raise CheckpointError(
                f'resume_from: {path}: expected a committed checkpoint, found no '
                f'{TRAINER_STATE_FILE} (an interrupted or damaged save). Pick an earlier step.'
            )
        return path, ''
    steps = committed_steps(path)
    if steps:
        raise CheckpointError(
            f'resume_from: {path}: expected a step directory, found a checkpoint root '
            f'holding {step_dir_names(steps)}. Pass one of them, e.g. {path / step_dir_name(steps[-1])}, '
            f'or --resume_from latest --checkpoint_dir {path}.'
        )
    raise CheckpointError(
        f'resume_from: {path}: expected a {STEP_PREFIX}_NNNNNN directory, found a '
        'directory that is not a checkpoint'
    )


def resume_into(config, parts) -> Resumed:
    """Resolves config.resume_from, and has the step's format check it against the run
    before anything is touched (every incompatibility at once) and restore it onto the
    run's shardings. `parts` is train/setup.py's TrainerSetup; its fresh state is returned
    unchanged when there is nothing to resume."""
    step_dir, notice = resolve_resume(
        config.resume_from,  # HEAD's --load arrives here too (config/infinitrain_flags.py)
        config.checkpoint_dir,
        config.get('checkpoint_format', registry.ORBAX.name),
    )
    messages = [notice] if notice else []
    if step_dir is None:
        return Resumed(parts.state, None, None, messages)
    resumed = registry.for_step_dir(step_dir).restore_into(config, parts, step_dir)
    resumed.messages[:0] = messages
    return resumed
