"""InfiniTrain step directories <-> the trainer's live state: read_step_dir and save_step_dir.

What maps to what:
  params                 <-> model.ckpt / model.bin / model.pth (llmc_io.infinitrain.names)
  optax ScaleByAdamState <-> Adam's StateDict: mu/nu = adam.m/adam.v by parameter name, count = adam.t
  ScaleByScheduleState   <-  global_step (the learning rate continues where the checkpoint stopped)
  data_position          <-> data_batch_idx / consumed_batches: one of our windows is accumulation x
                             data-parallel InfiniTrain batches, in the same token order (steps.py)
  rng, exact data position, loss, configs  -> the "jaxtrain" object of trainer_state.json (ours only)
A checkpoint written by InfiniTrain itself has no "jaxtrain" object: the run keeps its own seed's rng
(InfiniTrain's training has no randomness) and the position comes from the batch index.

Data beyond the end: InfiniTrain's DataLoader clamps its batch index at the last batch (b24d92f
infini_train/src/dataloader.cc operator++), i.e. it cannot train past one pass; our stream wraps to a
new epoch instead. Inside the first pass both read the same tokens; a wrapped position is written as the
unwrapped batch count (upstream would clamp it) and kept exactly in the "jaxtrain" object.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

import llmc_io
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import writer
from jaxtrain.checkpoint.formats.infinitrain.inspection import recorded_problems
from jaxtrain.checkpoint.formats.infinitrain.steps import LRS_FORMAT
from jaxtrain.checkpoint.layout import CheckpointError, step_dir_name
from jaxtrain.optim.optimizer import adam_states, put_tree, with_adam_moments
from llmc_io.infinitrain.state import CONFIG_DEFAULTS, HEAD, LR_SCHEDULER, PR, InfiniTrainState
from llmc_io.tensors import tree_leaves

SAVE_FORMATS = (it.HEAD_KIND, LRS_FORMAT, it.PR_BIN_KIND)  # what save_step_dir writes
_OPTIMIZER_TYPE = {'sgd': 'SGD', 'adam': 'Adam', 'adamw': 'AdamW'}


def expected_shapes(params_like) -> dict:
    return {path: tuple(leaf.shape) for path, leaf in tree_leaves(params_like).items()}


def read_step_dir(
    path,
    params_like,
    opt_like,
    batches_per_step: int,
    optimizer: str,
    run_pipeline: tuple[int, int] = (1, 1),
    run_context: int = 1,
    ckpt: it.InfiniTrainCheckpoint | None = None,
):
    """(params, opt_state or None, record) from an InfiniTrain step directory, on the shardings of the
    live trees. None: no moments to restore (no optimizer file, or this run's optimizer has none); the
    caller then starts fresh moments at the record's step. The record has step, data_position, rng (None
    unless jaxtrain wrote the checkpoint), learning_rate, kind and `messages` (lines for the log).
    run_pipeline: this run's (pipeline_parallel, virtual_pipeline_parallel), which tell a multi-GPU
    save's virtual stages apart where its files cannot (llmc_io/infinitrain/ranks.py). run_context:
    this run's context_parallel, said against the saved cp_size. ckpt: the directory as
    read_checkpoint already read it with params_like's shapes, or None to read it here."""
    if ckpt is None:
        ckpt = it.read_checkpoint(path, expected_shapes(params_like), run_pipeline=run_pipeline)
    state = ckpt.state
    refuse_recorded_problems(path, ckpt)  # before anything is put on the devices
    messages = list(ckpt.notices)
    extras = state.jaxtrain or {}
    record = dict(extras)
    record.update(
        step=state.global_step,
        learning_rate=state.last_lr,
        kind=ckpt.kind,
        generation=state.generation,
        messages=messages,
        # the saved run's layout, for the [CKPT] Load done line (ckpt_text.py)
        infinitrain_sizes={
            'ddp': state.ddp_size,
            'tp': state.tp_size,
            'sp': state.sp_size,
            'cp': state.cp_size,
            'pp': state.pp_size,
        },
    )
    saved_context = state.cp_size or 1  # a file without cp_size is read as 1 by d03ba16 (checkpoint.cc:219)
    if saved_context != run_context:
        messages.append(
            f'resume: {path}: saved with context parallel size {saved_context}, this run has {run_context}: '
            'laid out again for it (the weights and the data order do not depend on it); upstream '
            "refuses this resume (CHECK_EQ of cp_size, checkpoint_manager.cc:63-64 at feat/context_parallel "
            'd03ba16)'
        )
    if 'data_position' in extras:
        record['data_position'] = extras['data_position']
    else:
        record['data_position'] = it.position_from_batch_index(
            state.data_batch_idx, batches_per_step, ckpt.path / it.TRAINER_STATE
        )
    record.setdefault('rng', None)
    params = put_tree(params_like, ckpt.params, consume=True)
    opt_state = None
    live_adam = adam_states(opt_like)
    if ckpt.moments is not None and not live_adam:
        messages.append(
            f'resume: {path}: dropped the Adam moments (m, v, t={ckpt.moments[2]}): this run\'s '
            f'optimizer {optimizer} keeps none'
        )
    elif ckpt.moments is None and live_adam:
        messages.append(
            f'resume: {path} has no optimizer file (InfiniTrain writes none for SGD); starting '
            f'{optimizer} with fresh moments'
        )
    elif ckpt.moments is not None:
        saved = state.optimizer_type or (state.jaxtrain or {}).get('training_config', {}).get('optimizer')
        if saved and saved.lower() != optimizer:  # e.g. Adam's moments continued by adamw
            messages.append(f'resume: {path} was trained with {saved}; its m, v, t continue in {optimizer}')
        mu, nu, t = ckpt.moments
        opt_state = with_adam_moments(
            opt_like, mu, nu, adam_count=t, schedule_count=state.global_step, consume=len(live_adam) == 1
        )
    return params, opt_state, record


def refuse_recorded_problems(path, ckpt: it.InfiniTrainCheckpoint) -> None:
    """The first thing the step's records say is wrong (its digest, step, files' sha256s), as one
    CheckpointError; the files the read hashed are not read again."""
    problems, _ = recorded_problems(path, ckpt.path, ckpt.state, ckpt.digests)
    if problems:
        more = f'; {len(problems) - 1} more: python -m jaxtrain.ckpt verify {path}' if problems[1:] else ''
        raise CheckpointError(problems[0] + more)


def model_header(family: str, model_config):
    fields = (
        dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else dict(model_config)
    )
    cls = llmc_io.GPT2Header if family == 'gpt2' else llmc_io.LLaMA3Header
    return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)})


def infinitrain_state_for(
    fmt: str,
    family: str,
    *,
    step: int,
    batch_idx: int,
    learning_rate: float,
    best_loss,
    optimizer_type: str,
    extras: dict,
    data_parallel: int = 1,
    context_parallel: int = 1,
) -> InfiniTrainState:
    """The trainer_state.json of a step we write in InfiniTrain's layout `fmt`; `extras` becomes
    its "jaxtrain" object (what only we need for an exact resume). With context_parallel > 1 it
    carries cp_size, as the context-parallel branch writes it (d03ba16 checkpoint.cc:196)."""
    common = dict(
        global_step=step,
        data_batch_idx=batch_idx,
        last_lr=learning_rate,
        ddp_size=data_parallel,
        cp_size=context_parallel if context_parallel > 1 else None,
        jaxtrain=extras,
    )
    if fmt in (it.HEAD_KIND, LRS_FORMAT):
        # What HEAD's main.cc writes for a model from --llmc_filepath and CHECKs on --load: config defaults.
        generation = HEAD if fmt == it.HEAD_KIND else LR_SCHEDULER
        return InfiniTrainState(generation, shape=dict(CONFIG_DEFAULTS[family]), **common)
    return InfiniTrainState(
        PR,
        data_batch_stride=data_parallel,
        best_loss=math.inf if best_loss is None else float(best_loss),
        optimizer_type=optimizer_type,
        checkpoint_format='bin',
        **common,
    )


def save_step_dir(
    root,
    step: int,
    params,
    opt_state,
    record: dict,
    fmt: str,
    *,
    family: str,
    model_config,
    batches_per_step: int,
    data_parallel: int = 1,
    context_parallel: int = 1,
    lr_scheduler: bytes | None = None,
    plan_fetches=None,
) -> Path:
    """Write step_dir_name(step) under root in InfiniTrain's HEAD (`infinitrain`), LR-scheduler
    (`infinitrain-lrs`) or PR (`infinitrain-bin`) layout, atomically. record: our trainer-state record
    (trainer_state_record plus rng, and loss / best_loss when known); it becomes the "jaxtrain" object.
    opt_state None, or one without Adam moments (SGD), writes no optimizer file, as upstream.
    lr_scheduler: the lr_scheduler.ckpt bytes of an `infinitrain-lrs` save (None: no file).
    plan_fetches: writer.write_checkpoint's."""
    if fmt not in SAVE_FORMATS:
        raise ValueError(f"checkpoint_format: expected one of {', '.join(SAVE_FORMATS)}, found {fmt!r}")
    header = model_header(family, model_config)
    # The arrays stay where they are (a device copy, in a background save): each file's writer
    # fetches an entry (a layer of a leaf) as it writes it, so a few are on the host at a time.
    moments = None
    found = adam_states(opt_state) if opt_state is not None else []
    if found:
        adam = found[0]
        moments = (adam.mu, adam.nu, int(np.asarray(adam.count)))
    position = int(record['data_position'])
    extras = {k: v for k, v in record.items() if k != 'messages'}
    extras.update(step=step, checkpoint_format=fmt, model_shape=dataclasses.asdict(header))
    optimizer_type = _OPTIMIZER_TYPE.get(
        record.get('training_config', {}).get('optimizer'), 'Adam' if moments else 'SGD'
    )
    state = infinitrain_state_for(
        fmt,
        family,
        step=step,
        batch_idx=it.batch_index_from_position(position, batches_per_step),
        learning_rate=float(record.get('learning_rate', 0.0)),
        best_loss=record.get('best_loss'),
        optimizer_type=optimizer_type,
        extras=extras,
        data_parallel=data_parallel,
        context_parallel=context_parallel,
    )
    final = Path(root) / step_dir_name(step)
    kind = it.HEAD_KIND if fmt == LRS_FORMAT else fmt
    extra = {} if lr_scheduler is None else {'lr_scheduler.ckpt': lr_scheduler}
    return writer.write_checkpoint(
        final, kind, family, params, header, moments, state, extra_files=extra, plan_fetches=plan_fetches
    )
