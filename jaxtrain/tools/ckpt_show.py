"""`ckpt show`, and what `ckpt show` and `ckpt diff` print for people (--json prints everything,
always): tables, numbers, JSON.

An Orbax checkpoint records every one of the ~80 training keys. `show` lists those whose value is
not the key's default (config/keys.py), the ones a person set, and says how many it left out;
`--all` lists every key. Long lists of field names (`diff` across kinds: the fields only one side
records) are grouped by their first part and counted past a dozen, each line wrapped.
"""

from __future__ import annotations

import datetime
import json
import math
import textwrap
from pathlib import Path

from jaxtrain.config.keys import KEYS
from jaxtrain.tools.command_line import EXIT_OK

WIDTH = 100
LISTED_PER_GROUP = 12


def when_written(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime('%Y-%m-%d %H:%M:%S')


def show_text(step_dir, state: dict, show_all: bool = False) -> str:
    """The trainer state as `key  value` lines, then the training config (see the module doc)."""
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
        ('kind', 'orbax'),
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
    if lora:  # adapters only (checkpoint/lora_record.py); the base is the llmc source above
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


def field_list_lines(names: list[str]) -> list[str]:
    """`  PART: a, b, c` for each first part of the dotted names (plain names on a line of their own),
    a part of more than a dozen counted, and every line wrapped."""
    groups: dict[str, list[str]] = {}
    for name in names:
        head, _, rest = name.partition('.')
        groups.setdefault(head if rest else '', []).append(rest or head)
    lines = []
    for head, fields in groups.items():
        listed = ', '.join(fields[:LISTED_PER_GROUP])
        if len(fields) > LISTED_PER_GROUP:
            more = len(fields) - LISTED_PER_GROUP
            listed = f'{len(fields)} fields: {listed}, and {more} more (--json lists them)'
        lines += textwrap.wrap(
            f'{head}: {listed}' if head else listed,
            WIDTH,
            initial_indent='  ',
            subsequent_indent='    ',
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


# --- rendering -------------------------------------------------------------------------


def table(headers, rows: list[list]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ['  '.join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ['  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return '\n'.join(lines)


def number(x) -> str:
    if x is None:
        return 'n/a'
    return f'{x:.6g}' if isinstance(x, float) else str(x)


def json_safe(value):
    """Strict JSON: NaN and infinities become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def print_json(value):
    print(json.dumps(json_safe(value), indent=2, default=str))


def human_bytes(n: int) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024


# --- ckpt show ------------------------------------------------------------------------


TENSOR_COLUMNS = ('item', 'tensor', 'shape', 'dtype', 'sharding', 'min', 'max', 'mean', 'std', 'checksum', '')


def is_llmc_run(path) -> bool:
    from jaxtrain.checkpoint.formats.llmc_run import inspection as ckpt_llmc

    return ckpt_llmc.is_llmc(path)


def _llmc_show(args) -> int:
    from jaxtrain.checkpoint.formats.llmc_run import inspection as ckpt_llmc

    shown = ckpt_llmc.show(args.step_dir, args.tensors)
    if args.json:
        print_json(shown)
    else:
        print(ckpt_llmc.show_text(shown, table, number))
    return EXIT_OK


def _tensor_rows(step_dir, state: dict) -> list[dict]:
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect

    rows = []
    recorded_all = state.get('checksums', {})
    for item in ckpt_inspect.ARRAY_ITEMS:
        saved = (step_dir / item).is_dir()  # if not, its recorded tensors are listed as missing
        tensors = ckpt_inspect.read_tensors(step_dir, item) if saved else {}
        layouts = ckpt_inspect.tensor_layouts(step_dir, item) if saved else {}
        found = ckpt_inspect.recomputed_checksums(tensors)
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
                **ckpt_inspect.tensor_stats(array),
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


def cmd_show(args) -> int:
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    if is_llmc_run(args.step_dir):
        return _llmc_show(args)
    if ckpt_infinitrain.kind_of(args.step_dir) != 'orbax':
        return _show_infinitrain(args)
    gzipped = ckpt_infinitrain.it.gzipped_notice(args.step_dir)
    if gzipped:
        raise ckpt_infinitrain.CheckpointError(gzipped)
    step_dir = ckpt_inspect.find_finished_step_dir(args.step_dir)
    state = read_trainer_state(step_dir)
    rows = _tensor_rows(step_dir, state) if args.tensors else None
    if args.json:
        shown = {
            'path': str(step_dir),
            'kind': 'orbax',
            'trainer_state': {k: v for k, v in state.items() if k != 'checksums'},
        }
        if rows is not None:
            shown['tensors'] = rows
        print_json(shown)
        return EXIT_OK
    print(show_text(step_dir, state, args.all))
    if rows is not None:
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
        print()
        print(table(TENSOR_COLUMNS, cells))
        bad = [r for r in rows if r['checksum_status'] != 'ok']
        print(f'checksums: {len(rows) - len(bad)} of {len(rows)} ok' + ('' if not bad else ' (see verify)'))
    return EXIT_OK


def _show_infinitrain(args) -> int:
    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    shown = ckpt_infinitrain.show(Path(args.step_dir), args.tensors)
    if args.json:
        print_json(shown)
    else:
        print(ckpt_infinitrain.show_text(shown, table, number))
    return EXIT_OK
