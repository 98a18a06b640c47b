"""`jaxtrain.ckpt` on InfiniTrain step directories: which kind a checkpoint is, listing, show, verify, diff
across kinds; and what a jaxtrain-written step records about itself, checked (resume asks too).

Kinds: `orbax` (ours), `infinitrain` (HEAD model.ckpt), `infinitrain-bin` (PR llm.c model.bin),
`infinitrain-pth` (PR model.pth) -- jaxtrain/checkpoint/formats/infinitrain/steps.py.
Across kinds tensors are compared under common names: `params/<tree path>` (PARAMS_SPEC layout, kernels
(in, out)), and Adam's `adam.m/<tree path>`, `adam.v/<tree path>`, `adam.t` (optax's mu / nu / count of
its ScaleByAdamState; InfiniTrain's adam.m / adam.v / adam.t). The learning-rate schedule's count has no
InfiniTrain counterpart: it is the step, which the configs compare.

The record. jaxtrain adds a "jaxtrain" object to trainer_state.json (writer.py's write_checkpoint): its
own record (step, data position, rng, configs), the digest of every file beside it
(steps.FILE_DIGESTS), and the record's digest (trainer_state.py) over all of that. Resume and
`ckpt verify` both check it here, as they check an Orbax step's record and checksums: a weight
edited in model.ckpt, an edited global_step or data position, or a renamed directory is refused,
not trained from. A directory InfiniTrain itself wrote has no such object; only its name is
checked against its global_step.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
import textwrap
from pathlib import Path

import numpy as np

from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.ckpt_text import number, table
from jaxtrain.checkpoint.layout import DAMAGED, CheckpointError, step_of
from jaxtrain.checkpoint.trainer_state import DIGEST_FIELD, digest_problem, field_problems, file_sha256
from jaxtrain.checkpoint.trainer_state import step_name_problem
from llmc_io.errors import LLMCFormatError
from llmc_io.piece_digest import file_piece_digest
from llmc_io.infinitrain.state import HEAD, LR_SCHEDULER, PR
from llmc_io.tensors import all_finite, tree_leaves

ORBAX = 'orbax'


def kind_of(path) -> str:
    """'orbax' or one of the InfiniTrain kinds (an InfiniTrain directory is recognised by its model file)."""
    return it.detect_kind(path) or ORBAX


def read_step(step_dir, assemble: bool = True) -> it.InfiniTrainCheckpoint:
    """Read with the shapes of our model config when jaxtrain wrote it (GPT-2: Vp rows), else the files'.
    assemble=False: the stacked and transposed leaves stay the files' arrays (FileLeaf), for a
    reader that only checks them."""
    try:
        first = it.rank_dirs(step_dir)[0]
        expected = None
        from llmc_io.infinitrain.state import read_trainer_state

        extras = read_trainer_state(first / it.TRAINER_STATE).jaxtrain or {}
        if extras.get('model_config') and extras.get('model_family'):
            from jaxtrain.checkpoint.formats.orbax.inspection import expected_param_layouts

            expected = {
                k: v[0]
                for k, v in expected_param_layouts(extras['model_family'], extras['model_config']).items()
            }
        return it.read_checkpoint(step_dir, expected, assemble=assemble)
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None


# --- the common view of any checkpoint -----------------------------------------------------------------


def record_of(step_dir) -> dict:
    """A trainer-state dict for config_differences: ours as saved; InfiniTrain's jaxtrain object or fields."""
    if kind_of(step_dir) == ORBAX:
        from jaxtrain.checkpoint.trainer_state import read_trainer_state

        return read_trainer_state(step_dir)
    ckpt = read_step(step_dir)
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
    ckpt = read_step(step_dir)
    out.update({f'params/{k}': v for k, v in tree_leaves(ckpt.params).items()})
    if ckpt.moments is not None:
        mu, nu, t = ckpt.moments
        out.update({f'adam.m/{k}': v for k, v in tree_leaves(mu).items()})
        out.update({f'adam.v/{k}': v for k, v in tree_leaves(nu).items()})
        out['adam.t'] = np.asarray(t, np.int64)
    return out


# --- ls ------------------------------------------------------------------------------------------------


def ls_rows(root, kind: str) -> list[dict]:
    """`ckpt ls`'s rows of the step directories of `kind` under root (orbax/listing.py lists them beside
    ours), those whose files are still gzipped included, and PR's checkpoint_final (a copy of a step)."""
    root = Path(root)
    if not root.is_dir():
        return []
    rows = []
    for path in sorted(p for p in root.iterdir() if step_of(p) is not None and p.is_dir()):
        found = it.detect_kind(path)
        if found == kind:
            rows.append({'path': str(path), **_infinitrain_row(path, kind)})
        elif found is None and it.gzipped_kind(path) == kind:  # InfiniTrain's, still packed
            rows.append(
                {'path': str(path), 'kind': kind, 'status': f"gzipped: {', '.join(it.gzipped_files(path))}"}
            )
    final = root / 'checkpoint_final'
    if it.detect_kind(final) == kind:
        rows.append(
            {
                'path': str(final),
                'size_bytes': sum(p.stat().st_size for p in final.rglob('*') if p.is_file()),
                'written_at': final.stat().st_mtime,
                'written_from': 'mtime',
                **_infinitrain_row(final, kind),
            }
        )
    return rows


def _infinitrain_row(path: Path, kind: str) -> dict:
    row = {'kind': kind, 'committed': True, 'status': 'committed', 'written_from': 'mtime'}
    try:
        first = it.rank_dirs(path)[0]
        from llmc_io.infinitrain.state import read_trainer_state

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


# --- show ----------------------------------------------------------------------------------------------


def show(step_dir, with_tensors: bool) -> dict:
    ckpt = read_step(step_dir)
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
        shown['jaxtrain'] = {
            k: v
            for k, v in s.jaxtrain.items()
            if k not in ('training_config', it.FILE_DIGESTS, it.LEGACY_FILE_DIGESTS)
        }
    if with_tensors:
        from jaxtrain.checkpoint.formats.orbax.inspection import tensor_stats

        shown['tensors'] = [
            {'name': name, 'shape': list(a.shape), 'dtype': a.dtype.name, **tensor_stats(a)}
            for name, a in canonical_tensors(step_dir).items()
        ]
    return shown


def show_text(shown: dict) -> str:
    """`show`'s dict for people: one field per line, then the tensor table with --tensors."""
    shown = dict(shown)
    tensors = shown.pop('tensors', None)
    width = max(len(k) for k in shown)
    lines = []
    for key, value in shown.items():
        lines += textwrap.wrap(
            _text_value(key, value),
            width=100,
            initial_indent=f'{key.ljust(width)}  ',
            subsequent_indent=' ' * (width + 2),
            break_long_words=False,
            break_on_hyphens=False,
        )
    if tensors is not None:
        rows = [
            [t['name'], 'x'.join(map(str, t['shape'])) or '()', t['dtype']]
            + [number(t.get(k)) for k in ('min', 'max', 'mean', 'std')]
            for t in tensors
        ]
        lines += ['', table(['tensor', 'shape', 'dtype', 'min', 'max', 'mean', 'std'], rows)]
    return '\n'.join(lines)


def _text_value(key: str, value) -> str:
    """One field of `show` for people: a mapping as `name=value` pairs; the jaxtrain record by its
    field names (`--json` has their values); upstream's shape fields with what they are."""
    if key == 'notices':
        return '; '.join(value) or 'none'
    if key == 'jaxtrain' and isinstance(value, dict):
        return f"{len(value)} fields ({', '.join(value)}); --json shows their values"
    if isinstance(value, dict):
        text = ' '.join(f'{k}={v}' for k, v in value.items())
        if key == 'shape_fields':
            # Upstream writes its GPT2Config()/LLaMA3Config() defaults here for a run started from an
            # llm.c file; `model` above is what the tensors hold.
            text += ' (trainer_state.json\'s; upstream\'s config defaults when it started from an llm.c file)'
        return text
    return str(value)


# --- verify --------------------------------------------------------------------------------------------


# --- the jaxtrain record ---


def recorded_problems(step_dir, files_dir, state, known: dict | None = None) -> tuple[list[str], list[str]]:
    """(problems, what was checked) of one step directory. files_dir: where the model file and
    trainer_state.json are (rank_000000 for a multi-rank step); state: its InfiniTrainState.
    known: {file path: digest} already taken by the read of these files (steps.read_checkpoint),
    which are then not read again; what is hashed here is added to it."""
    files_dir = Path(files_dir)
    record_file = files_dir / it.TRAINER_STATE
    problems, checked = [], []
    named = step_name_problem(state.global_step, step_dir, record_file)
    problems += [named.replace('step: expected', 'global_step: expected')] if named else []
    record = state.jaxtrain
    if record is None:
        return problems, checked
    digest = digest_problem(record, step_dir, record_file)
    if digest:
        problems.append(digest.replace(f': {DIGEST_FIELD}:', f': jaxtrain.{DIGEST_FIELD}:', 1))
    else:
        checked.append(f'the jaxtrain record matches its {DIGEST_FIELD}')
    with_rng = record if record.get('rng') is not None else {k: v for k, v in record.items() if k != 'rng'}
    fields = field_problems(with_rng, record_file, only_present=True)
    problems += [line.replace(f'{record_file}: ', f'{record_file}: jaxtrain.', 1) for line in fields]
    for key, upstream in (('step', state.global_step),):
        if key in record and record[key] != upstream:
            problems.append(
                f'{record_file}: global_step: expected {record[key]} (the jaxtrain record\'s {key}), found '
                f'{upstream}: the file was edited; {DAMAGED}'
            )
    problems += _other_rank_records(step_dir, files_dir, record)
    key = it.FILE_DIGESTS if it.FILE_DIGESTS in record else it.LEGACY_FILE_DIGESTS
    recorded = record.get(key)  # none in older rank directories; the digest shows none was removed
    if not isinstance(recorded, dict):
        return problems, checked
    # A multi-rank step names every rank's files from the step directory (rank_000001/model.ckpt).
    paths = {
        name: Path(step_dir) / str(name) if '/' in str(name) else files_dir / str(name) for name in recorded
    }
    if key == it.FILE_DIGESTS:  # each file's pieces on threads of their own
        found_of = {
            name: _piece_digest(path, {} if known is None else known) if path.is_file() else 'no file'
            for name, path in paths.items()
        }
    else:  # a whole-file sha256 is one stream: every file on its own thread (hashlib lets go of the GIL)
        with concurrent.futures.ThreadPoolExecutor(max(1, len(paths)), thread_name_prefix='sha256') as pool:
            hashing = {name: pool.submit(file_sha256, path) for name, path in paths.items() if path.is_file()}
            found_of = {name: hashing[name].result() if name in hashing else 'no file' for name in paths}
    for name, expected in recorded.items():
        path, found = paths[name], found_of[name]
        if found != expected:
            problems.append(
                f'{path}: {key}: expected {expected} (recorded by jaxtrain), found {found}: the file was '
                f'changed after it was saved; {DAMAGED}'
            )
    if not any(f'{key}: expected' in p for p in problems):
        checked.append(f'{key} of {len(recorded)} files as recorded')
    return problems, checked


def _piece_digest(path: Path, known: dict) -> str:
    """The file's digest, from `known` (the read that took it) or taken now and kept there: a resume's
    record check and its verify ask for the same files (a multi-rank step's other ranks), read once."""
    key = os.fspath(path)
    if key not in known:
        known[key] = file_piece_digest(path)
    return known[key]


def _other_rank_records(step_dir, files_dir: Path, record: dict) -> list[str]:
    """Every rank of a multi-rank step carries the same jaxtrain record as the first (whose digest,
    step and files are checked): one that differs was edited or comes from another save."""
    from llmc_io.infinitrain.state import read_trainer_state

    problems = []
    for rank in it.rank_dirs(step_dir):
        if rank == files_dir:
            continue
        try:
            other = read_trainer_state(rank / it.TRAINER_STATE).jaxtrain
        except (LLMCFormatError, OSError) as e:
            problems.append(str(e))
            continue
        if other != record:
            problems.append(
                f'{rank / it.TRAINER_STATE}: jaxtrain: expected the record of {files_dir / it.TRAINER_STATE} '
                f'(every rank saves the same one), found another: the file was edited or copied from '
                f'another save; {DAMAGED}'
            )
    return problems


def verify(step_dir, ckpt: it.InfiniTrainCheckpoint | None = None):
    """Verification(problems, checked) of an InfiniTrain directory: every file parses byte-exactly, names and
    shapes fit one model, GPT-2's tied copy and causal masks, Adam's keys and t, finiteness, our digests.
    ckpt: the directory as a resume has just read it (its reading made the parse's checks, and took
    its files' digests), or None to read it here."""
    from jaxtrain.checkpoint.format import Verification

    problems, checked = [], []
    if ckpt is None:
        try:
            ckpt = read_step(step_dir, assemble=False)  # checked, not used: no transposed copies
        except CheckpointError as e:
            return Verification([str(e)], checked)
    checked.append(f'model file and trainer_state.json readable ({ckpt.ranks} rank dir(s))')
    checked.append(f'params: {len(tree_leaves(ckpt.params))} tensors fit one {ckpt.family} model')
    for name, value in tree_leaves(ckpt.params).items():
        if not all_finite(value):
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
        from llmc_io.infinitrain.ranks import replica_differences

        differences = replica_differences(it.rank_dirs(step_dir), ckpt.topology)
        problems += differences
        if not differences:
            kind = 'data- and context-parallel' if ckpt.topology.cp > 1 else 'data-parallel'
            checked.append(f'weights of the {ckpt.topology.replicas} {kind} replicas bit-identical')
    # The record's digest, its step, the files' digests (those the read took are not taken again).
    found, passed = recorded_problems(step_dir, ckpt.path, ckpt.state, ckpt.digests)
    problems += found
    checked += passed
    checked += ckpt.notices
    return Verification(problems, checked)
