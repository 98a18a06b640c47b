"""Our own checkpoints as a format: Orbax step directories (manager.py writes them).

A step is `checkpoint_step_NNNNNN/` with params/, opt_state/ (when saved) and
trainer_state/ (the JSON record, trainer_state.py). Restoring checks the record against the
run first (every incompatibility at once), then restores the arrays onto the run's
shardings, whatever the saving mesh was, and verifies their checksums.
"""

import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import math
import re
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxtrain.checkpoint.format import Resumed, Verification, Weights, fresh_optimizer_state
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
from jaxtrain.checkpoint.resume_checks import resume_problems as lora_resume_problems
from jaxtrain.checkpoint.manager import Checkpointer, checksum_mismatches, tensor_checksums
from jaxtrain.checkpoint.trainer_state import check_digest
from jaxtrain.checkpoint.resume_checks import check_data, check_weights_file
from jaxtrain.checkpoint.trainer_state import (
    check_resumable,
    compare_with_run,
    run_training_config,
    read_trainer_state,
    topology_change,
)
from jaxtrain.parallel import sharding

# GB of an item's arrays that Orbax reads into host memory before they are on the device (each of
# the two items has its own). Orbax's default (96) read a whole LLaMA-3.2 1B step (16.75 GiB) into
# host memory at once: 32.4 GiB peak RSS, 11.5 s; with 2, 10.8 GiB and 11.4 s (one H100, cold cache).
# Orbax refuses to read an array at least this large, so the largest array raises it (restore_gb).
RESTORE_CONCURRENT_GB = 2


class OrbaxFormat:
    """--checkpoint_format orbax (the default): asynchronous, sharded, checksummed saves."""

    name = 'orbax'
    title = 'Orbax'
    no_val_loss = ''

    def owns(self, step_dir) -> bool:
        return is_committed(Path(step_dir))

    def committed_steps(self, root) -> list[int]:
        return committed_steps(root)

    def step_path(self, root, step: int) -> Path:
        return Path(root) / step_dir_name(step)

    def open(self, config, parts, protected_steps) -> Checkpointer:
        return Checkpointer(
            config.checkpoint_dir,
            keep_latest=config.max_checkpoint_keep,
            keep_every=config.keep_every_steps,
            protected_steps=protected_steps,
        )

    def read_record(self, step_dir) -> dict:
        return read_trainer_state(step_dir)

    def verify(self, step_dir) -> Verification:
        """Record, digest, field types, every item's tensors against their checksums, params'
        shapes against the model config. restore() checks the same on what a resume reads."""
        from jaxtrain.checkpoint.formats.orbax.inspection import verify

        return verify(step_dir)

    def read_weights(self, step_dir) -> Weights:
        """params/ as NumPy on the host, whatever devices saved it; a LoRA step's are its adapters."""
        record = read_trainer_state(step_dir)
        item_dir = Path(step_dir).absolute() / 'params'
        try:
            metadata = ocp.PyTreeCheckpointer().metadata(item_dir).item_metadata.tree
            as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
            params = ocp.PyTreeCheckpointer().restore(
                item_dir, args=ocp.args.PyTreeRestore(restore_args=as_numpy)
            )
        except Exception as e:  # noqa: BLE001  Orbax raises many kinds for a damaged directory
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f'{item_dir}: could not read the saved weights: {first}') from e
        family = record.get('model_family')
        return Weights(family, params, f'checkpoint {step_dir}', record.get('model_config'), record)

    def find_step(self, path, finished: bool = True) -> Path:
        from jaxtrain.checkpoint.formats.orbax import inspection

        return inspection.find_finished_step_dir(path) if finished else inspection.find_step_dir(path)

    def ls_rows(self, root) -> list[dict]:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.ls_rows(root)

    def ls(self, root, rows: list[dict], validation) -> dict:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.ls(root, rows, validation)

    def ls_text(self, listed: dict) -> str:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.ls_text(listed)

    def show(self, step_dir, with_tensors: bool) -> dict:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.show(step_dir, with_tensors)

    def show_text(self, shown: dict, show_all: bool) -> str:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.show_text(shown, show_all)

    def diff_view(self, step_dir, common: bool) -> tuple[dict, dict]:
        """Our items (params, opt_state; None where not saved), or the common names for a diff with
        another format (infinitrain/inspection.py maps optax's Adam state to them)."""
        from jaxtrain.checkpoint.formats.orbax.inspection import ARRAY_ITEMS, read_tensors

        record = read_trainer_state(step_dir)
        if common:
            from jaxtrain.checkpoint.formats.infinitrain.inspection import canonical_tensors

            return record, {'': canonical_tensors(step_dir)}
        saved = {item: (Path(step_dir) / item).is_dir() for item in ARRAY_ITEMS}
        return record, {item: read_tensors(step_dir, item) if saved[item] else None for item in ARRAY_ITEMS}

    def refuse_as_source(self, path, command: str, target: str = '') -> None:
        return None

    def resume_step(self, path: Path) -> Path:
        """--resume_from PATH checked as one of our step directories: a committed one, or a line
        saying what PATH is instead (nothing, an unfinished save, a root) and what to pass."""
        if not path.exists():
            steps = committed_steps(path.parent)
            pick = (  # the way forward: the steps that are there
                f'{path.parent} holds {step_dir_names(steps)}; pass one of them, or '
                f'--checkpoint_dir {path.parent} --resume_from latest'
                if steps
                else f'{path.parent} holds no committed checkpoint'
            )
            raise CheckpointError(
                f'resume_from: {path}: expected a {STEP_PREFIX}_NNNNNN directory, found nothing there. '
                f'{pick}.'
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
            return path
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

    def restore_into(self, config, parts, step_dir: Path) -> Resumed:
        try:
            saved = read_trainer_state(step_dir)
            check_digest(saved, step_dir)  # before its fields are compared with the run
            check_resumable(saved, step_dir)  # and of the types and ranges that comparison assumes
        except CheckpointError as e:
            raise CheckpointError(str(e).replace(DAMAGED, damaged_advice(step_dir))) from None
        model_config = dataclasses.asdict(parts.setup.model_config)
        run_config = run_training_config(config, parts.geometry.tokens_per_step)
        incompatible, changes = compare_with_run(saved, model_config, run_config)
        incompatible += lora_resume_problems(saved, config, parts.setup)  # settings and base file
        if incompatible:
            raise CheckpointError(
                f'{step_dir}: does not fit this run: '
                + '; '.join(incompatible)
                + '. Resume it with the settings it was saved with (python -m jaxtrain.ckpt show '
                f'{step_dir} lists them), or start a new run without --resume_from.'
            )
        messages = [f'resume: changed since the checkpoint: {change}' for change in changes]
        messages += check_data(saved, config, step_dir) + check_weights_file(saved, config, step_dir)
        state = parts.state
        try:
            params, opt_state, saved = restore(step_dir, state.params, state.opt_state)
        except CheckpointError as e:  # name the step to resume instead of the generic advice
            if DAMAGED not in str(e):
                raise
            raise CheckpointError(str(e).replace(DAMAGED, damaged_advice(step_dir))) from e
        if opt_state is None:
            messages.append(
                f'resume: {step_dir} has no optimizer state; starting with fresh optimizer moments'
            )
            opt_state = fresh_optimizer_state(parts, params, saved['step'])
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
    # The two items side by side: each restore drains its own reads before it returns, and the
    # optimizer state (two thirds of an AdamW step) would otherwise start only then.
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix='jaxtrain-restore') as pool:
        params_read = pool.submit(_restore_item, step_dir, 'params', params_like)
        opt_read = (
            pool.submit(_restore_item, step_dir, 'opt_state', opt_state_like) if has_opt_state else None
        )
        params = params_read.result()
        opt_state = opt_read.result() if opt_read is not None else None
    checksums = trainer_state.get('checksums', {})
    problems = checksum_mismatches(tensor_checksums(params), checksums.get('params', {}), 'params')
    if opt_state is not None:
        problems += checksum_mismatches(
            tensor_checksums(opt_state), checksums.get('opt_state', {}), 'opt_state'
        )
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


def restore_gb(like) -> float:
    """Orbax's restore_concurrent_gb for a tree like `like`: RESTORE_CONCURRENT_GB, or more where an
    array needs it (Orbax's limiter refuses a read of its whole limit or more)."""
    largest = max(
        (math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(like)), default=0
    )
    return max(RESTORE_CONCURRENT_GB, 2 * largest / 10**9)


def _restore_item(step_dir: Path, item: str, like):
    try:
        with _quiet_restore_errors():
            handler = ocp.StandardCheckpointHandler(restore_concurrent_gb=restore_gb(like))
            checkpointer = ocp.Checkpointer(handler)
            return checkpointer.restore(step_dir / item, args=ocp.args.StandardRestore(_abstract(like)))
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
