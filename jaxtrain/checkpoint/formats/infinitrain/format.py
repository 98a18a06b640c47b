"""InfiniTrain step directories as a checkpoint format (checkpoint/format.py): which steps a root
holds, the run's checkpointer (saver.py), reading, verifying and restoring a step of any kind, and
what `ckpt` shows of it (inspection.py) and writes from it (export.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoint.format import Resumed, Verification, Weights, fresh_optimizer_state, refuse_problems
from jaxtrain.checkpoint.formats.infinitrain import schedule as infinitrain_schedule
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.saver import InfiniTrainCheckpointer, batches_per_step
from jaxtrain.checkpoint.formats.infinitrain.steps import LRS_FORMAT
from jaxtrain.checkpoint.formats.infinitrain.trainer import (
    expected_shapes,
    read_step_dir,
    refuse_recorded_problems,
)
from jaxtrain.checkpoint.layout import CheckpointError, step_dir_name
from jaxtrain.checkpoint.trainer_state import compare_with_run, run_training_config
from jaxtrain.optim.optimizer import spelled_with_infinitrain_flags
from jaxtrain.parallel import sharding
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.state import read_trainer_state as read_infinitrain_state


def _placer(state):
    """read_state_dict's place for a state on one device: each float array read is put there at once
    (the step's integer counts stay on the host); None for a state across devices, whose leaves
    are made on the host (put_tree)."""
    arrays = [leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, jax.Array)]
    devices = {device for leaf in arrays for device in leaf.sharding.device_set}
    if len(devices) != 1:
        return None
    (device,) = devices

    def place(array: np.ndarray):
        return jax.device_put(array, device) if array.dtype == np.float32 and array.ndim else array

    return place


class InfiniTrainFormat:
    """InfiniTrain's step directories, one generation of them (steps.py's GENERATIONS): every
    generation restores; those a run saves also write."""

    title = 'InfiniTrain'
    no_val_loss = ''  # the "jaxtrain" object of trainer_state.json records it

    def __init__(self, generation: it.Generation):
        self.generation = generation
        self.name = generation.name
        self.reads = generation.files  # the kind of files it owns: infinitrain-lrs writes HEAD's

    def owns(self, step_dir) -> bool:
        """A step directory of this kind. One whose files are still gzipped (as samples are shipped)
        is refused here, so every way in says so rather than calling it a damaged Orbax save."""
        kind = it.detect_kind(step_dir)
        if kind is None and (gzipped := it.gzipped_notice(step_dir)):
            raise CheckpointError(gzipped)
        return kind == self.reads

    def committed_steps(self, root) -> list[int]:
        return [it.step_number(d) for d in it.step_dirs(root)]

    def step_path(self, root, step: int) -> Path:
        return Path(root) / step_dir_name(step)

    def open(self, config, parts, protected_steps) -> InfiniTrainCheckpointer:
        # infinitrain with InfiniTrain's schedule flags writes their generation (schedule.py).
        lrs = self.name == it.HEAD_KIND and spelled_with_infinitrain_flags(config)
        fmt = LRS_FORMAT if lrs else self.name
        return InfiniTrainCheckpointer(
            config.checkpoint_dir,
            fmt,
            parts,
            family=config.model_family,
            keep_latest=config.max_checkpoint_keep,
            keep_every=config.keep_every_steps,
            protected_steps=protected_steps,
            config=config,
        )

    def read_record(self, step_dir) -> dict:
        """The "jaxtrain" object of trainer_state.json (what only we write) as saved, so that its
        record_sha256 can be checked; else InfiniTrain's own step and best_loss."""
        state = read_infinitrain_state(it.rank_dirs(step_dir)[0] / it.TRAINER_STATE)
        if state.jaxtrain is not None:
            return dict(state.jaxtrain)
        return {'step': state.global_step, 'best_loss': state.best_loss}

    def verify(self, step_dir) -> Verification:
        """Every rank's files parse and fit one model; the data-parallel replicas are equal; the
        jaxtrain record's digest and every file's recorded sha256 hold (rank directories
        included); finite weights, Adam's t, the scheduler file."""
        from jaxtrain.checkpoint.formats.infinitrain.inspection import verify

        return verify(step_dir)

    def read_weights(self, step_dir) -> Weights:
        """The model file of any generation and rank layout; the model config is jaxtrain's record of
        it, else what the files say (model_shape_from_files)."""
        try:
            ckpt = it.read_checkpoint(step_dir, None, with_optimizer=False)
        except LLMCFormatError as e:
            raise CheckpointError(str(e)) from None
        record = dict(ckpt.state.jaxtrain) if ckpt.state.jaxtrain else None
        model_config = (record or {}).get('model_config') or (record or {}).get('model_shape')
        what = f'InfiniTrain checkpoint {step_dir} ({ckpt.kind})'
        return Weights(
            ckpt.family, ckpt.params, what, model_config or it.model_shape_from_files(ckpt), record
        )

    def find_step(self, path, finished: bool = True) -> Path:
        return Path(path)

    def ls_rows(self, root) -> list[dict]:
        from jaxtrain.checkpoint.formats.infinitrain.inspection import ls_rows

        return ls_rows(root, self.reads)

    def ls(self, root, rows: list[dict], validation) -> dict:
        """Its step directories share a root with ours: the listing of such a root (a step directory
        given for one is refused there, naming its parent)."""
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.ls(root, rows, validation)

    def ls_text(self, listed: dict) -> str:
        from jaxtrain.checkpoint.formats.orbax import listing

        return listing.ls_text(listed)

    def show(self, step_dir, with_tensors: bool) -> dict:
        from jaxtrain.checkpoint.formats.infinitrain.inspection import show

        return show(Path(step_dir), with_tensors)

    def show_text(self, shown: dict, show_all: bool) -> str:
        from jaxtrain.checkpoint.formats.infinitrain.inspection import show_text

        return show_text(shown)

    def diff_view(self, step_dir, common: bool) -> tuple[dict, dict]:
        """Params and Adam's moments under the common names, whatever the other side (inspection.py)."""
        from jaxtrain.checkpoint.formats.infinitrain.inspection import canonical_tensors, record_of

        return record_of(step_dir), {'': canonical_tensors(step_dir)}

    def refuse_as_source(self, path, command: str, target: str = '') -> None:
        return None

    def resume_step(self, path: Path) -> Path:
        return Path(path)  # owns() has read its files' kind

    def restore_into(self, config, parts, step_dir: Path) -> Resumed:
        """Everything is checked (model family, names, shapes, vocabulary, batch geometry)
        before the run's state is touched."""
        state = parts.state
        run_pipeline = (config.pipeline_parallel, config.virtual_pipeline_parallel)
        try:
            # Read once: the same arrays and the sha256 taken while reading serve verify and the
            # restore (a 1B step is 17 GiB; each further read of it is seconds). On one device each
            # array goes there as it is read, and the leaves are stacked and transposed there
            # (put_tree): the host never holds the step.
            ckpt = it.read_checkpoint(
                step_dir,
                expected_shapes(state.params),
                run_pipeline=run_pipeline,
                assemble=False,
                place=_placer((state.params, state.opt_state)),
            )
            # What the records say first, then every check `ckpt verify` makes, also on the files
            # that read did not need (the other ranks, the replicas), before the state is made of
            # the arrays (which uses them up): a resume refuses what verify rejects.
            from jaxtrain.checkpoint.formats.infinitrain.inspection import verify

            refuse_recorded_problems(step_dir, ckpt)
            refuse_problems(verify(step_dir, ckpt), step_dir, 'resume_from')
            params, opt_state, saved = read_step_dir(
                step_dir,
                state.params,
                state.opt_state,
                batches_per_step(parts),
                config.optimizer,
                run_pipeline,
                parts.geometry.context,
                ckpt=ckpt,
            )
        except LLMCFormatError as e:
            raise CheckpointError(f'{e}') from None
        del ckpt  # what is left of its arrays: the state is on the devices now
        messages = list(saved.pop('messages'))
        generation = saved.pop('generation')
        messages += infinitrain_schedule.resume_schedule(
            config, parts.schedule, step_dir, saved['step'], generation
        )
        if 'model_config' in saved:  # written by jaxtrain: the compatibility check of our own checkpoints
            incompatible, changes = compare_with_run(
                saved,
                dataclasses.asdict(parts.setup.model_config),
                run_training_config(config, parts.geometry.tokens_per_step),
            )
            if incompatible:
                raise CheckpointError(
                    f'{step_dir}: does not fit this run: '
                    + '; '.join(incompatible)
                    + '. Resume it with the settings it was saved with, or start a new run.'
                )
            messages += [f'resume: changed since the checkpoint: {change}' for change in changes]
        if opt_state is None:
            opt_state = fresh_optimizer_state(parts, params, saved['step'])
        replicated = parts.replicated
        rng = (
            state.rng
            if saved['rng'] is None
            else sharding.put_global(np.asarray(saved['rng'], np.uint32), replicated)
        )
        if saved['rng'] is None:
            messages.append(
                f'resume: {step_dir} was written by InfiniTrain: no rng saved, keeping seed {config.seed}\'s'
            )
        state = state.replace(
            step=sharding.put_global(np.int32(saved['step']), replicated),
            data_position=sharding.put_global(np.int32(saved['data_position']), replicated),
            params=params,
            opt_state=opt_state,
            rng=rng,
        )
        messages.append(
            f"resume: restored step {saved['step']} from {step_dir} ({saved['kind']}, data position "
            f"{saved['data_position']})"
        )
        return Resumed(state, step_dir, saved, messages)
