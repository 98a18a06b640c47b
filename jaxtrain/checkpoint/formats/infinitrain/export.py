"""`ckpt export --format infinitrain|infinitrain-lrs|infinitrain-bin`: any jaxtrain (Orbax) or
InfiniTrain step written as InfiniTrain's step directory, as one GPU's or (HEAD's files, the first
two formats) as the rank directories of any topology (--ddp, --tp, --pp, --cp, --zero_stage).
state_from_orbax, an Orbax step's params, Adam moments and record, is llmc_run/writer.py's too."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain import writer
from jaxtrain.checkpoint.formats.infinitrain.steps import LRS_FORMAT
from jaxtrain.checkpoint.formats.infinitrain.trainer import infinitrain_state_for, model_header
from jaxtrain.checkpoint.layout import CheckpointError, step_of
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain.lr_scheduler import FILE_NAME
from llmc_io.infinitrain.topology import Topology
from jaxtrain.checkpoint.formats.infinitrain.inspection import ORBAX, read_step, canonical_tensors, kind_of


def export(step_dir, output, fmt: str, force: bool = False, topology: Topology | None = None) -> dict:
    """Write `output` (a checkpoint_step_NNNNNN directory) in InfiniTrain format `fmt` from any checkpoint;
    with `force`, over an earlier export there (export_target.py says what else is refused); with a
    topology, as the rank directories of that multi-GPU run."""
    from jaxtrain.checkpoint.export_target import EXPORTED_FROM, check_step_dir_output

    output = Path(output)
    if step_of(output) is None:
        raise CheckpointError(
            f'--output: {output}: expected a checkpoint_step_NNNNNN directory to create, '
            f'found another name (InfiniTrain\'s --load / --resume_from take such a directory)'
        )
    if Path(step_dir).absolute() == output.absolute():
        raise CheckpointError(f'--output: {output}: expected another directory than STEP_DIR, found the same')
    replacing = check_step_dir_output(output, force)
    if kind_of(step_dir) == ORBAX:
        family, params, moments, record, header = state_from_orbax(step_dir)
    else:
        ckpt = read_step(step_dir)
        family, params, moments = ckpt.family, ckpt.params, ckpt.moments
        record = dict(
            ckpt.state.jaxtrain or {}, step=ckpt.state.global_step, learning_rate=_next_lr(step_dir, ckpt)
        )
        if ckpt.state.best_loss is not None and math.isfinite(ckpt.state.best_loss):  # inf: none yet
            record.setdefault('best_loss', ckpt.state.best_loss)  # (the record is JSON, which has no inf)
        shape = record.get('model_shape')
        header = model_header(family, shape) if shape else _header_from_files(ckpt)
        record.setdefault('data_batch_idx', ckpt.state.data_batch_idx)
    step = int(record['step'])
    position_batches = record.get('data_batch_idx')
    if position_batches is None:
        tokens = record.get('tokens_per_step')
        rows = record.get('training_config', {})
        per_batch = rows.get('batch_size', 0) * rows.get('sequence_length', 0)
        position_batches = (
            record['data_position'] * (tokens // per_batch)
            if tokens and per_batch
            else record['data_position']
        )
    extras = {k: v for k, v in record.items() if k != 'data_batch_idx'}
    extras.update(
        checkpoint_format=fmt, model_shape=dataclasses.asdict(header), **{EXPORTED_FROM: str(Path(step_dir))}
    )
    state = infinitrain_state_for(
        fmt,
        family,
        step=step,
        batch_idx=int(position_batches),
        learning_rate=float(record.get('learning_rate', 0.0)),
        best_loss=record.get('best_loss'),
        optimizer_type='Adam' if moments else 'SGD',
        extras=extras,
    )
    kind, extra = fmt, {}
    if fmt == LRS_FORMAT:  # HEAD's files, and the scheduler's state (formats/infinitrain/schedule.py)
        from jaxtrain.checkpoint.formats.infinitrain.schedule import exported_scheduler

        kind, scheduler = it.HEAD_KIND, exported_scheduler(step_dir, record, step)
        extra = {} if scheduler is None else {FILE_NAME: scheduler}
    try:
        writer.write_checkpoint(
            output,
            kind,
            family,
            params,
            header,
            moments,
            state,
            replace=replacing,
            topology=topology,
            extra_files=extra,
        )
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None
    return {
        'output': str(output),
        'kind': fmt,
        'model_family': family,
        'step': step,
        'optimizer_file': moments is not None,
        'topology': topology.describe() if topology else None,
        'upstream_flags': topology.upstream_flags() if topology else '',
        'ranks': topology.world if topology else 1,
    }


def _next_lr(step_dir, ckpt) -> float:
    """last_lr, or where the LR-scheduler generation keeps it: lr_scheduler.ckpt's recover_lr (0 without)."""
    if ckpt.state.last_lr is not None:
        return ckpt.state.last_lr
    from jaxtrain.checkpoint.formats.infinitrain.schedule import saved_scheduler

    found = saved_scheduler(step_dir)
    if found:
        return float(found[1].get('recover_lr', 0.0))
    return float((ckpt.state.jaxtrain or {}).get('learning_rate', 0.0))


def export_line(written: dict) -> str:
    no_optimizer = '' if written['optimizer_file'] else ' (no optimizer file: no Adam state)'
    if written.get('topology'):
        return (
            f"wrote {written['output']}: {written['kind']} checkpoint of {written['model_family']} step "
            f"{written['step']} as {written['ranks']} rank directories ({written['topology']})"
            f"{no_optimizer}; "
            f"InfiniTrain resumes it with {written['upstream_flags']} --load {written['output']}"
        )
    return (
        f"wrote {written['output']}: {written['kind']} checkpoint of {written['model_family']} step "
        f"{written['step']}{no_optimizer}; InfiniTrain resumes it with --load (HEAD) / --resume_from (PR) "
        f"{written['output']}"
    )


def _header_from_files(ckpt):
    """The model header of an upstream-written directory: only the PR's llm.c model.bin carries one."""
    if ckpt.kind == it.PR_BIN_KIND:
        import llmc_io

        return llmc_io.load_model(ckpt.path / it.FILES[ckpt.kind][0])[0]
    raise CheckpointError(
        f'{ckpt.path}: model shape: expected jaxtrain\'s record of it or an llm.c model.bin, found neither '
        '(a CKPT file has no head count or RoPE settings, and HEAD\'s trainer_state.json holds config '
        'defaults); '
        'export from the PR generation\'s directory, or resume it with --llmc_filepath and save again'
    )


def state_from_orbax(step_dir):
    from jaxtrain.checkpoint.trainer_state import read_trainer_state
    from jaxtrain.checkpoint.formats.orbax.inspection import find_step_dir, model_config_object, restore_item

    # A folder that is no checkpoint at all is told so, not named a damaged one below.
    step_dir = find_step_dir(step_dir)
    record = read_trainer_state(step_dir)
    family = record['model_family']
    header = model_header(family, dataclasses.asdict(model_config_object(family, record['model_config'])))
    params = restore_item(step_dir, 'params')
    moments = None
    if (Path(step_dir) / 'opt_state').is_dir():
        tensors = canonical_tensors(step_dir)
        if 'adam.t' in tensors:
            mu, nu = {}, {}
            from llmc_io.tensors import tree_set

            for name, value in tensors.items():
                if name.startswith('adam.m/'):
                    tree_set(mu, name[len('adam.m/') :], value)
                elif name.startswith('adam.v/'):
                    tree_set(nu, name[len('adam.v/') :], value)
            moments = (mu, nu, int(tensors['adam.t']))
    return family, params, moments, record, header


def write(fmt, args) -> tuple[dict, str]:
    """`ckpt export --format infinitrain|infinitrain-lrs|infinitrain-bin` from a step of any format:
    (what was written, for --json; the line for people)."""
    from jaxtrain.checkpoint.export_target import topology_from_args

    if args.version is not None:
        raise CheckpointError(
            f'--version: expected none with --format {args.format} (InfiniTrain reads fp32 only), '
            f'found {args.version}'
        )
    topology = topology_from_args(args)
    written = export(args.step_dir, args.output, args.format, args.force, topology)
    return {'path': str(args.step_dir), **written}, export_line(written)
