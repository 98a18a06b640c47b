"""Resuming: which step directory to resume from, restoring it onto the run's shardings,
and `resume_into`, the one call the training loop makes.

Resume order: an explicit `resume_from` step directory, or `latest` (the newest committed
step in checkpoint_dir), else the llm.c file the run was given, else random init (the
last two are model setup's, models/setup.py).

Topology: arrays are saved sharded as they live on the mesh and restored onto the current
run's shardings whatever the saving mesh was (8 devices -> 1, 1 -> 8, FSDP -> data
parallel); the resume line names what changed.
"""

import contextlib
import dataclasses
import gc
import logging
import re
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from jaxtrain.checkpoint.checksums import checksum_mismatches
from jaxtrain.checkpoint.lora_record import resume_problems as lora_resume_problems
from jaxtrain.checkpoint.layout import (
    DAMAGED,
    STEP_PREFIX,
    TRAINER_STATE_FILE,
    UNFINISHED_SAVE,
    CheckpointError,
    committed_steps,
    damaged_advice,
    is_committed,
    step_dir_name,
    step_dir_names,
    step_of,
)
from jaxtrain.checkpoint.record_digest import check_digest
from jaxtrain.checkpoint.resume_checks import check_data, check_weights_file
from jaxtrain.checkpoint.trainer_state import (
    check_resumable,
    compare_with_run,
    read_trainer_state,
    topology_change,
)
from jaxtrain.parallel import sharding


def resolve_resume(resume_from: str, checkpoint_dir: str) -> tuple[Path | None, str]:
    """Returns (step directory or None, a notice for the log)."""
    if not resume_from:
        return None, ''
    if resume_from == 'latest':
        if not checkpoint_dir:
            raise CheckpointError(
                "resume_from: 'latest' needs checkpoint_dir; found checkpoint_dir empty. "
                'Pass --checkpoint_dir DIR.'
            )
        steps = committed_steps(checkpoint_dir)
        if not steps:
            return None, f'resume_from=latest: no committed checkpoint in {checkpoint_dir}; starting fresh'
        # Absolute: Orbax refuses relative paths, and the README's commands use them.
        return Path(checkpoint_dir).absolute() / step_dir_name(steps[-1]), ''
    path = Path(resume_from).absolute()
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


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def restore(step_dir: Path, params_like, opt_state_like):
    """Restores (params, opt_state or None, trainer_state) onto the shardings of the
    given live trees; the optimizer state is restored against its abstract tree so
    optax's namedtuples come back as namedtuples. Checksums are verified."""
    step_dir = Path(step_dir).absolute()  # Orbax refuses relative paths
    trainer_state = read_trainer_state(step_dir)
    check_digest(trainer_state, step_dir)
    check_resumable(trainer_state, step_dir)
    has_opt_state = (step_dir / 'opt_state').is_dir()
    if trainer_state.get('has_optimizer_state') and not has_opt_state:
        raise CheckpointError(
            f'{step_dir}: opt_state: expected the optimizer state (the trainer state says '
            f'has_optimizer_state), found no opt_state directory; {DAMAGED}'
        )
    params = _restore_item(step_dir, 'params', params_like)
    opt_state = _restore_item(step_dir, 'opt_state', opt_state_like) if has_opt_state else None
    checksums = trainer_state.get('checksums', {})
    problems = checksum_mismatches(params, checksums.get('params', {}), 'params')
    if opt_state is not None:
        problems += checksum_mismatches(opt_state, checksums.get('opt_state', {}), 'opt_state')
    if problems:
        raise CheckpointError(
            f'{step_dir}: checksum verification failed: ' + '; '.join(problems) + f'; {DAMAGED}'
        )
    return params, opt_state, trainer_state


class _Quiet(logging.Filter):
    def filter(self, record):
        return record.levelno < logging.ERROR


@contextlib.contextmanager
def _quiet_restore_errors():
    """A damaged item fails every concurrent read of it, and asyncio logs each failed task
    with its traceback and TensorStore spec (hundreds of lines for one bad zstd chunk)
    besides the exception restore raises, which becomes the one-line refusal."""
    quiet, loggers = _Quiet(), [logging.getLogger(name) for name in ('asyncio', 'absl')]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        gc.collect()  # tasks whose exceptions nobody read log them when collected
        for logger in loggers:
            logger.removeFilter(quiet)


def _first_cause(error: BaseException) -> str:
    """The innermost cause's text (TensorStore's own reason, e.g. ZSTD_decompressStream()
    failed), else the error's."""
    for _ in range(20):  # a chain, not a cycle, but bounded all the same
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    return str(error)


def _restore_item(step_dir: Path, item: str, like):
    try:
        with _quiet_restore_errors():
            return ocp.StandardCheckpointer().restore(step_dir / item, _abstract(like))
    except Exception as e:  # Orbax and TensorStore raise many kinds for a damaged item
        text = ' '.join(str(e).split()).split(' See full TensorStore details')[0] or type(e).__name__
        cause = ' '.join(_first_cause(e).split()).split(' See full TensorStore details')[0]
        cause = re.sub(r' in OCDBT database at local file "[^"]*"', '', cause)  # the step dir says where
        if cause and cause not in text:
            text = f'{text} {cause}'
        reason = text if len(text) <= 240 else text[:237] + '...'
        raise CheckpointError(
            f'{step_dir}: {item}: could not restore the saved arrays ({reason}); {DAMAGED}'
        ) from e


def set_schedule_position(opt_state, step: int):
    """Fresh optimizer moments, but the learning-rate schedule continues at `step`."""
    is_schedule = lambda s: isinstance(s, optax.ScaleByScheduleState)
    return jax.tree.map(
        lambda s: optax.ScaleByScheduleState(count=np.asarray(step, np.int32)) if is_schedule(s) else s,
        opt_state,
        is_leaf=is_schedule,
    )


@dataclasses.dataclass
class Resumed:
    """What resume_into gives the loop: the state to train from, the step directory it
    came from (None for a fresh start), its trainer-state record, and the lines to log."""

    state: object
    step_dir: Path | None
    record: dict | None
    messages: list


def resume_into(config, parts) -> Resumed:
    """Resolves config.resume_from, checks the checkpoint against the run before anything
    is touched (every incompatibility at once), and restores it onto the run's shardings.
    `parts` is train/setup.py's TrainerSetup; its fresh state is returned unchanged when
    there is nothing to resume."""
    from jaxtrain.checkpoint.formats.infinitrain_saver import resume_from_infinitrain

    foreign = resume_from_infinitrain(config, parts, Resumed)  # an InfiniTrain step directory
    if foreign is not None:
        return foreign
    step_dir, notice = resolve_resume(config.resume_from, config.checkpoint_dir)
    messages = [notice] if notice else []
    if step_dir is None:
        return Resumed(parts.state, None, None, messages)
    try:
        saved = read_trainer_state(step_dir)
        check_digest(saved, step_dir)  # before its fields are compared with the run
    except CheckpointError as e:
        raise CheckpointError(str(e).replace(DAMAGED, damaged_advice(step_dir))) from None
    model_config = dataclasses.asdict(parts.setup.model_config)
    incompatible, changes = compare_with_run(saved, model_config, config.to_dict())
    incompatible += lora_resume_problems(saved, config, parts.setup)  # settings and base file
    if incompatible:
        raise CheckpointError(
            f'{step_dir}: does not fit this run: '
            + '; '.join(incompatible)
            + '. Resume it with the settings it was saved with (python -m jaxtrain.ckpt show '
            f'{step_dir} lists them), or start a new run without --resume_from.'
        )
    messages += [f'resume: changed since the checkpoint: {change}' for change in changes]
    messages += check_data(saved, config, step_dir) + check_weights_file(saved, config, step_dir)
    state = parts.state
    try:
        params, opt_state, saved = restore(step_dir, state.params, state.opt_state)
    except CheckpointError as e:  # name the step to resume instead of the generic advice
        if DAMAGED not in str(e):
            raise
        raise CheckpointError(str(e).replace(DAMAGED, damaged_advice(step_dir))) from e
    if opt_state is None:
        messages.append(f'resume: {step_dir} has no optimizer state; starting with fresh optimizer moments')
        fresh = lambda p: set_schedule_position(parts.tx.init(p), saved['step'])
        opt_state = jax.jit(fresh, out_shardings=parts.opt_shardings)(params)
    replicated = parts.replicated
    state = state.replace(
        step=sharding.put_global(np.int32(saved['step']), replicated),
        data_position=sharding.put_global(np.int32(saved['data_position']), replicated),
        params=params,
        opt_state=opt_state,
        rng=sharding.put_global(np.asarray(saved['rng'], dtype=np.uint32), replicated),
    )
    messages.append(
        f"resume: restored step {saved['step']} from {step_dir} "
        f"({topology_change(saved.get('topology', {}), parts.topology)})"
    )
    return Resumed(state, step_dir, saved, messages)
