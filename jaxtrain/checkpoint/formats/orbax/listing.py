"""`ckpt ls` of a root of checkpoint_step_NNNNNN directories, whichever format wrote each, and
`ckpt show` of one of our steps.

Every format's step directories share the name, so one root may hold several kinds: this listing
lists every step directory as ours and then takes each other format's row for the directories it
claims (format.CheckpointFormat.ls_rows), which also adds what is not a step of ours
(InfiniTrain PR's checkpoint_final, a copy of a step).

An Orbax checkpoint records every one of the ~80 training keys. `show` lists those whose value is
not the key's default (config/keys.py), the ones a person set, and says how many it left out;
`--all` lists every key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxtrain.checkpoint.ckpt_text import human_bytes, number, table, when_written
from jaxtrain.checkpoint.formats.orbax import inspection
from jaxtrain.checkpoint.layout import CheckpointError, best_steps, step_of
from jaxtrain.checkpoint.trainer_state import read_trainer_state
from jaxtrain.config.keys import KEYS

KIND = 'orbax'


# --- ls ---------------------------------------------------------------------------------


def _is_step(row: dict) -> bool:
    """A step of its own (PR's checkpoint_final is a copy of one, never the latest or a best)."""
    return step_of(Path(row['path'])) is not None


def ls_rows(root) -> list[dict]:
    """Every step directory under root as ours (listing.list_checkpoints), with the train loss its
    record holds; another format's row replaces the directories it claims (ls)."""
    entries, _ = inspection.list_checkpoints(root)
    rows = []
    for e in entries:
        row = {**dataclasses.asdict(e), 'path': str(e.path), 'kind': KIND, 'loss': None}
        if e.committed:
            try:
                row['loss'] = read_trainer_state(e.path).get('loss')
            except CheckpointError:
                pass
        rows.append(row)
    return rows


def _kept_best(rows) -> set:
    """The step directories --keep_best keeps: the N lowest validation losses among the steps of the
    newest step's lineage, N from that step's run."""
    committed = [r for r in rows if r.get('committed') and r.get('step') is not None and _is_step(r)]
    recorded = [r for r in committed if 'keep_best' in r]  # the newest run's whose record is intact
    if not recorded:
        return set()
    newest = max(recorded, key=lambda r: r['step'])
    ranked = [r for r in recorded if r.get('lineage') == newest.get('lineage')]
    steps = best_steps({r['step']: r.get('val_loss') for r in ranked}, newest['keep_best'])
    return {r['path'] for r in committed if r['step'] in steps}


def _is_latest(row: dict, latest) -> bool:
    return row['committed'] and row['step'] == latest and _is_step(row)


def ls(root, others: list[dict], validation) -> dict:
    """{'root', 'latest', 'checkpoints'}: ours and `others` (other formats' rows) by step, each
    committed one with its validation record, the newest committed step of any kind the latest."""
    claimed = {row['path']: row for row in others}
    rows = []
    for row in ls_rows(root):
        row.update(claimed.pop(row['path'], {}))
        rows.append(row)
    rows += claimed.values()  # what is not a step directory of ours (checkpoint_final)
    for row in rows:
        if row.get('committed') and _is_step(row):
            row.update(validation(row['path']))
    latest = max((r['step'] for r in rows if r['committed'] and _is_step(r)), default=None)
    best = _kept_best(rows)
    checkpoints = [{**r, 'latest': _is_latest(r, latest), 'kept_best': r['path'] in best} for r in rows]
    return {'root': str(root), 'latest': latest, 'checkpoints': checkpoints}


def _loss_cell(row: dict) -> str:
    """The step's loss as the step line prints it, else InfiniTrain PR's running minimum, marked 'best'."""
    if row.get('loss') is not None:
        return f"{row['loss']:.6f}"
    if row.get('best_loss') is not None:
        return f"best {row['best_loss']:.6f}"
    return 'n/a'


def ls_text(listed: dict) -> str:
    root, latest, rows = listed['root'], listed['latest'], listed['checkpoints']
    cells = [
        [
            r['step'],
            Path(r['path']).name,
            r['kind'],
            r['status'],
            human_bytes(r['size_bytes']),
            when_written(r['written_at']) + ('' if r['written_from'] == 'trainer_state' else ' (mtime)'),
            'yes' if r['has_optimizer_state'] else 'no',
            _loss_cell(r),
            ', '.join(
                (['latest'] if r['latest'] else [])
                + ([f"best (val {r['val_loss']:.6f})"] if r['kept_best'] else [])
            ),
        ]
        for r in rows
    ]
    lines = [table(['step', 'directory', 'kind', 'state', 'size', 'written', 'optimizer', 'loss', ''], cells)]
    packed = [r for r in rows if r['status'].startswith('gzipped')]
    if packed:
        lines.append(
            f'{len(packed)} step(s) hold gzipped InfiniTrain files: gunzip {root}/*/*.gz to use them'
        )
    if latest is None:
        lines.append(f'latest: none (no committed checkpoint in {root})')
    else:
        kind = next(r['kind'] for r in rows if r['latest'])
        flag = '' if kind == KIND else f" --checkpoint_format {kind.replace('-pth', '-bin')}"
        lines.append(f'latest: step {latest} (what --resume_from latest --checkpoint_dir {root}{flag} picks)')
    return '\n'.join(lines)


# --- show -------------------------------------------------------------------------------

TENSOR_COLUMNS = ('item', 'tensor', 'shape', 'dtype', 'sharding', 'min', 'max', 'mean', 'std', 'checksum', '')


def _tensor_rows(step_dir, state: dict) -> list[dict]:
    rows = []
    recorded_all = state.get('checksums', {})
    for item in inspection.ARRAY_ITEMS:
        saved = (step_dir / item).is_dir()  # if not, its recorded tensors are listed as missing
        tensors = inspection.read_tensors(step_dir, item) if saved else {}
        layouts = inspection.tensor_layouts(step_dir, item) if saved else {}
        found = inspection.host_checksums(tensors)
        recorded = recorded_all.get(item, {})
        for name in sorted(set(tensors) | set(recorded)):
            row = {'item': item, 'name': name}
            if name not in tensors:
                row.update(checksum=recorded[name], checksum_status='missing: recorded but not saved')
                rows.append(row)
                continue
            array, layout = tensors[name], layouts.get(name)
            row.update(
                shape=list(array.shape),
                dtype=array.dtype.name,
                sharding=layout.sharding if layout else 'n/a',
                **inspection.tensor_stats(array),
                checksum=found[name],
            )
            if name not in recorded:
                row['checksum_status'] = 'not recorded'
            elif recorded[name] == found[name]:
                row['checksum_status'] = 'ok'
            else:
                row['checksum_status'] = f'MISMATCH: recorded {recorded[name]}'
            rows.append(row)
    return rows


def show(step_dir, with_tensors: bool) -> dict:
    step_dir = Path(step_dir)
    state = read_trainer_state(step_dir)
    shown = {
        'path': str(step_dir),
        'kind': KIND,
        'trainer_state': {k: v for k, v in state.items() if k != 'checksums'},
    }
    if with_tensors:
        shown['tensors'] = _tensor_rows(step_dir, state)
    return shown


def show_text(shown: dict, show_all: bool = False) -> str:
    """The trainer state as `key  value` lines, then the training config (see the module doc), then
    the tensors with their checksums when read."""
    text = _state_text(shown['path'], shown['trainer_state'], show_all)
    rows = shown.get('tensors')
    if rows is None:
        return text
    cells = [
        [
            r['item'],
            r['name'],
            ('x'.join(map(str, r['shape'])) or '()') if 'shape' in r else '',
            r.get('dtype', ''),
            r.get('sharding', ''),
            *(number(r.get(k)) for k in ('min', 'max', 'mean', 'std')),
            r['checksum'],
            r['checksum_status'],
        ]
        for r in rows
    ]
    bad = [r for r in rows if r['checksum_status'] != 'ok']
    checked = f'checksums: {len(rows) - len(bad)} of {len(rows)} ok' + ('' if not bad else ' (see verify)')
    return '\n'.join([text, '', table(TENSOR_COLUMNS, cells), checked])


def _state_text(step_dir, state: dict, show_all: bool) -> str:
    topology = state.get('topology', {})
    mesh = ','.join(f'{k}={v}' for k, v in topology.get('mesh', {}).items())
    versions = ', '.join(f'{k} {v}' for k, v in state.get('versions', {}).items())
    model = ' '.join(f'{k}={v}' for k, v in (state.get('model_config') or {}).items())
    llmc = state.get('llmc_file') or ''
    position = (
        f"{state.get('data_position')} windows consumed (epoch {state.get('epoch')}), "
        f"{state.get('tokens_per_step')} tokens per step"
    )
    devices = (
        f"{topology.get('device_count')} {topology.get('platform')} device(s), "
        f"{topology.get('process_count')} process(es), mesh {mesh}"
    )
    lines = [
        ('checkpoint', str(step_dir)),
        ('kind', KIND),
        ('step', state.get('step')),
        ('data position', position),
        ('learning rate', f"{state.get('learning_rate')} (for the next step)"),
        ('saved at', when_written(state['saved_at']) if 'saved_at' in state else 'n/a'),
        ('optimizer state', 'saved' if state.get('has_optimizer_state') else 'not saved'),
        ('model', f"{state.get('model_family')}: {model}"),
        ('dtype', state.get('dtype')),
        ('topology', devices),
        ('versions', versions),
        ('llmc source', f"{llmc} (sha256 {state.get('llmc_sha256')})" if llmc else 'none (random init)'),
    ]
    lora = state.get('lora')
    if lora:  # adapters only (checkpoint/resume_checks.py); the base is the llmc source above
        lora_line = (
            f"LoRA checkpoint: rank {lora.get('rank')}, alpha {lora.get('alpha')}, targets "
            f"{','.join(lora.get('targets', []))} ({', '.join(lora.get('modules', []))}), "
            f"{lora.get('num_parameters', 0):,} adapter parameters; base weights not stored"
        )
        lines.append(('lora', lora_line))
    width = max(len(k) for k, _ in lines)
    text = [f'{k.ljust(width)}  {v}' for k, v in lines]
    return '\n'.join(text + training_config_lines(state.get('training_config') or {}, show_all))


def training_config_lines(training: dict, show_all: bool) -> list[str]:
    """The recorded training config: every key with show_all, else those off their default."""
    if not training:
        return []
    defaults = {key: default for key, default, _ in KEYS}
    shown = {
        key: value
        for key, value in training.items()
        if show_all or key not in defaults or value != defaults[key] or key == 'model_family'
    }
    left_out = len(training) - len(shown)
    head = 'training config' + (
        f' (the {left_out} keys at their default left out; --all lists them)' if left_out else ''
    )
    key_width = max(map(len, shown)) if shown else 0
    return [head] + [f'  {k.ljust(key_width)}  {v!r}' for k, v in sorted(shown.items())]
