"""`jaxtrain.ckpt` on InfiniTrain step directories: which kind a checkpoint is, listing, show, verify, diff
across kinds, and export between kinds.

Kinds: `orbax` (ours), `infinitrain` (HEAD model.ckpt), `infinitrain-bin` (PR llm.c model.bin),
`infinitrain-pth` (PR model.pth) -- jaxtrain/checkpoint/formats/infinitrain/steps.py.
Across kinds tensors are compared under common names: `params/<tree path>` (PARAMS_SPEC layout, kernels
(in, out)), and Adam's `adam.m/<tree path>`, `adam.v/<tree path>`, `adam.t` (optax's mu / nu / count of
its ScaleByAdamState; InfiniTrain's adam.m / adam.v / adam.t). The learning-rate schedule's count has no
InfiniTrain counterpart: it is the step, which the configs compare.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.record import recorded_problems
from jaxtrain.checkpoint.formats.infinitrain.trainer import LRS_FORMAT, infinitrain_state_for, model_header
from jaxtrain.checkpoint.layout import CheckpointError, step_of
from llmc_io.errors import LLMCFormatError
from llmc_io.infinitrain_lr_scheduler import FILE_NAME
from llmc_io.infinitrain_state import HEAD, LR_SCHEDULER, PR
from llmc_io.infinitrain_topology import Topology
from llmc_io.tensors import tree_leaves

ORBAX = 'orbax'


def kind_of(path) -> str:
    """'orbax' or one of the InfiniTrain kinds (an InfiniTrain directory is recognised by its model file)."""
    return it.detect_kind(path) or ORBAX


def _read(step_dir) -> it.InfiniTrainCheckpoint:
    """Read with the shapes of our model config when jaxtrain wrote it (GPT-2: Vp rows), else the files'."""
    try:
        first = it.rank_dirs(step_dir)[0]
        expected = None
        from llmc_io.infinitrain_state import read_trainer_state

        extras = read_trainer_state(first / it.TRAINER_STATE).jaxtrain or {}
        if extras.get('model_config') and extras.get('model_family'):
            from jaxtrain.checkpoint.formats.orbax.inspection import expected_param_layouts

            expected = {
                k: v[0]
                for k, v in expected_param_layouts(extras['model_family'], extras['model_config']).items()
            }
        return it.read_checkpoint(step_dir, expected)
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None


# --- the common view of any checkpoint -----------------------------------------------------------------


def record_of(step_dir) -> dict:
    """A trainer-state dict for config_differences: ours as saved; InfiniTrain's jaxtrain object or fields."""
    if kind_of(step_dir) == ORBAX:
        from jaxtrain.checkpoint.trainer_state import read_trainer_state

        return read_trainer_state(step_dir)
    ckpt = _read(step_dir)
    record = dict(ckpt.state.jaxtrain or {})
    record.setdefault('model_family', ckpt.family)
    record['step'] = ckpt.state.global_step
    record.setdefault('data_batch_idx', ckpt.state.data_batch_idx)
    return record


def canonical_tensors(step_dir) -> dict[str, np.ndarray]:
    """{common name: array} of params and Adam moments, for a diff across kinds."""
    out = {}
    if kind_of(step_dir) == ORBAX:
        from jaxtrain.checkpoint.formats.orbax.inspection import read_tensors

        out.update({f'params/{k}': v for k, v in read_tensors(step_dir, 'params').items()})
        if (Path(step_dir) / 'opt_state').is_dir():
            opt = read_tensors(step_dir, 'opt_state')
            prefixes = {m.group(1) for k in opt if (m := re.fullmatch(r'(.*?)/?mu/.+', k))}
            for key, value in opt.items():
                m = re.fullmatch(r'(.*?)/?(mu|nu)/(.+)', key)
                if m and m.group(1) in prefixes:
                    out[f"adam.{'m' if m.group(2) == 'mu' else 'v'}/{m.group(3)}"] = value
                elif key.rsplit('/', 1)[0] in prefixes and key.endswith('count'):
                    out['adam.t'] = np.asarray(value, np.int64)
        return out
    ckpt = _read(step_dir)
    out.update({f'params/{k}': v for k, v in tree_leaves(ckpt.params).items()})
    if ckpt.moments is not None:
        mu, nu, t = ckpt.moments
        out.update({f'adam.m/{k}': v for k, v in tree_leaves(mu).items()})
        out.update({f'adam.v/{k}': v for k, v in tree_leaves(nu).items()})
        out['adam.t'] = np.asarray(t, np.int64)
    return out


# --- ls ------------------------------------------------------------------------------------------------


def annotate_entries(root, entries, validation) -> list[dict]:
    """ckpt_inspect's StepEntry list as dicts with `kind` and `loss`; InfiniTrain directories (which that
    listing sees as incomplete Orbax steps) re-described, and PR's checkpoint_final added.
    `validation(step_dir)` gives a committed step's {'val_loss', 'keep_best', 'lineage'} (the caller
    asks the registry, which a format may not import)."""
    rows = []
    for e in entries:
        row = {**dataclasses.asdict(e), 'path': str(e.path), 'kind': ORBAX, 'loss': None}
        kind = it.detect_kind(e.path)
        if kind is not None:
            row.update(_infinitrain_row(e.path, kind))
        elif it.gzipped_kind(e.path) is not None:  # not an Orbax step: InfiniTrain's, still packed
            gzipped = ', '.join(it.gzipped_files(e.path))
            row.update(kind=it.gzipped_kind(e.path), status=f'gzipped: {gzipped}')
        elif e.committed:
            from jaxtrain.checkpoint.trainer_state import read_trainer_state

            try:
                row['loss'] = read_trainer_state(e.path).get('loss')
            except CheckpointError:
                pass
        if row.get('committed'):
            row.update(validation(e.path))
        rows.append(row)
    final = Path(root) / 'checkpoint_final'
    if it.detect_kind(final):
        row = _infinitrain_row(final, it.detect_kind(final))
        rows.append(
            {
                'path': str(final),
                'size_bytes': sum(p.stat().st_size for p in final.rglob('*') if p.is_file()),
                'written_at': final.stat().st_mtime,
                'written_from': 'mtime',
                **row,
            }
        )
    return rows


def _infinitrain_row(path: Path, kind: str) -> dict:
    row = {'kind': kind, 'committed': True, 'status': 'committed', 'written_from': 'mtime'}
    try:
        first = it.rank_dirs(path)[0]
        from llmc_io.infinitrain_state import read_trainer_state

        state = read_trainer_state(first / it.TRAINER_STATE)
        extras = state.jaxtrain or {}
        row.update(
            step=state.global_step,
            loss=extras.get('loss'),
            has_optimizer_state=(first / it.FILES[kind][1]).is_file(),
        )
        if extras.get('saved_at'):
            row.update(written_at=float(extras['saved_at']), written_from='trainer_state')
        if row['loss'] is None and state.best_loss is not None and math.isfinite(state.best_loss):
            row['best_loss'] = state.best_loss  # PR's running minimum; upstream keeps no step loss
    except (LLMCFormatError, OSError) as e:
        row.update(committed=False, status=f'damaged: {e}')
    return row


def latest_step(entries: list[dict], orbax_latest):
    """The newest committed step of either kind (PR's checkpoint_final is a copy, not a step of its own)."""
    if orbax_latest is not None and all(e['kind'] == ORBAX for e in entries):
        return orbax_latest
    steps = [e['step'] for e in entries if e['committed'] and not e['path'].endswith('checkpoint_final')]
    return max(steps) if steps else None


def is_latest(entry: dict, latest) -> bool:
    return entry['committed'] and entry['step'] == latest and not entry['path'].endswith('checkpoint_final')


# --- show ----------------------------------------------------------------------------------------------


def show(step_dir, with_tensors: bool) -> dict:
    ckpt = _read(step_dir)
    s = ckpt.state
    files = {p.name: p.stat().st_size for p in sorted(ckpt.path.iterdir()) if p.is_file()}
    header = {k: v.shape for k, v in tree_leaves(ckpt.params).items()}
    shown = {
        'path': str(step_dir),
        'kind': ckpt.kind,
        'generation': s.generation,
        'family': ckpt.family,
        'ranks': ckpt.ranks,
        'global_step': s.global_step,
        'data_batch_idx' if s.generation == PR else 'consumed_batches': s.data_batch_idx,
        'topology': {
            k: getattr(s, k)
            for k in ('ddp_size', 'tp_size', 'sp_size', 'cp_size', 'pp_size')
            if getattr(s, k) is not None  # cp_size: only files of the context-parallel generation
        },
        'optimizer': 'Adam (m, v, t = %d)' % ckpt.moments[2]
        if ckpt.moments
        else 'no optimizer file (SGD, or not saved)',
        'files': files,
        'notices': ckpt.notices,
        'model': {
            'num_layers': header['h/ln_1/scale'][0],
            'channels': header['h/ln_1/scale'][1],
            'vocab_rows': header['wte/embedding'][0],
        },
    }
    if s.generation == LR_SCHEDULER:  # no last_lr: the scheduler file holds the learning rate
        from jaxtrain.checkpoint.formats.infinitrain.schedule import show_fields

        shown.update(show_fields(step_dir))
    else:
        shown['last_lr'] = s.last_lr
    if s.generation in (HEAD, LR_SCHEDULER):
        shown['shape_fields'] = (
            s.shape
        )  # GPT2Config()/LLaMA3Config() defaults when trained from an llm.c file
    else:
        shown.update(
            best_loss=s.best_loss, optimizer_type=s.optimizer_type, checkpoint_format=s.checkpoint_format
        )
    if s.jaxtrain:
        shown['jaxtrain'] = {k: v for k, v in s.jaxtrain.items() if k not in ('training_config', 'sha256')}
    if with_tensors:
        from jaxtrain.checkpoint.formats.orbax.inspection import tensor_stats

        shown['tensors'] = [
            {'name': name, 'shape': list(a.shape), 'dtype': a.dtype.name, **tensor_stats(a)}
            for name, a in canonical_tensors(step_dir).items()
        ]
    return shown


def show_text(shown: dict, table, number) -> str:
    """`show`'s dict for people: one field per line, then the tensor table with --tensors."""
    shown = dict(shown)
    tensors = shown.pop('tensors', None)
    width = max(len(k) for k in shown)
    lines = []
    for key, value in shown.items():
        if key == 'notices':
            value = '; '.join(value) or 'none'
        lines.append(f'{key.ljust(width)}  {value}')
    if tensors is not None:
        rows = [
            [t['name'], 'x'.join(map(str, t['shape'])) or '()', t['dtype']]
            + [number(t.get(k)) for k in ('min', 'max', 'mean', 'std')]
            for t in tensors
        ]
        lines += ['', table(['tensor', 'shape', 'dtype', 'min', 'max', 'mean', 'std'], rows)]
    return '\n'.join(lines)


# --- verify --------------------------------------------------------------------------------------------


def verify(step_dir):
    """Verification(problems, checked) of an InfiniTrain directory: every file parses byte-exactly, names and
    shapes fit one model, GPT-2's tied copy and causal masks, Adam's keys and t, finiteness, our sha256s."""
    from jaxtrain.checkpoint.format import Verification

    problems, checked = [], []
    try:
        ckpt = _read(step_dir)
    except CheckpointError as e:
        return Verification([str(e)], checked)
    checked.append(f'model file and trainer_state.json readable ({ckpt.ranks} rank dir(s))')
    checked.append(f'params: {len(tree_leaves(ckpt.params))} tensors fit one {ckpt.family} model')
    for name, value in tree_leaves(ckpt.params).items():
        if not np.all(np.isfinite(value)):
            problems.append(f'{ckpt.path}: params[{name}]: expected finite values, found NaN or inf')
    if ckpt.moments is not None:
        t = ckpt.moments[2]
        checked.append(f'optimizer: Adam m and v for every parameter, t = {t}')
        if t != ckpt.state.global_step:
            problems.append(f'{ckpt.path}: adam.t: expected global_step {ckpt.state.global_step}, found {t}')
    from jaxtrain.checkpoint.formats.infinitrain.schedule import verify_scheduler

    scheduler_problems, scheduler_checked = verify_scheduler(step_dir, ckpt.state.global_step)
    problems += scheduler_problems
    checked += scheduler_checked
    for rank in it.rank_dirs(step_dir)[1:]:
        if it.detect_kind(rank) != ckpt.kind:
            problems.append(f'{rank}: expected the same {ckpt.kind} files as rank_000000, found others')
    if ckpt.topology is not None and ckpt.topology.replicas > 1:
        from llmc_io.infinitrain_ranks import replica_differences

        differences = replica_differences(it.rank_dirs(step_dir), ckpt.topology)
        problems += differences
        if not differences:
            kind = 'data- and context-parallel' if ckpt.topology.cp > 1 else 'data-parallel'
            checked.append(f'weights of the {ckpt.topology.replicas} {kind} replicas bit-identical')
    found, passed = recorded_problems(step_dir, ckpt.path, ckpt.state)  # digest, step, files' sha256
    problems += found
    checked += passed
    checked += ckpt.notices
    return Verification(problems, checked)


# --- export --------------------------------------------------------------------------------------------


def topology_from_args(args) -> Topology | None:
    """The multi-GPU layout export's flags name, None for one GPU; refused with any format but infinitrain."""
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
    if args.format not in (it.HEAD_KIND, LRS_FORMAT):
        raise CheckpointError(
            f'--ddp/--tp/--cp/--pp/--vpp/--zero_stage/--sequence_parallel: expected only with --format '
            f'infinitrain or infinitrain-lrs (HEAD rank directories), found --format {args.format}'
        )
    try:
        topology.validate('export')
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None
    return topology


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
        family, params, moments, record, header = _from_orbax(step_dir)
    else:
        ckpt = _read(step_dir)
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
        it.write_checkpoint(
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


def _from_orbax(step_dir):
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
