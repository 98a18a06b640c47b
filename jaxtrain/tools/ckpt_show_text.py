"""What `ckpt show` and `ckpt diff` print for people (--json prints everything, always).

An Orbax checkpoint records every one of the ~80 training keys. `show` lists those whose value is
not the key's default (config/keys.py), the ones a person set, and says how many it left out;
`--all` lists every key. Long lists of field names (`diff` across kinds: the fields only one side
records) are grouped by their first part and counted past a dozen, each line wrapped.
"""

from __future__ import annotations

import datetime
import textwrap

from jaxtrain.config.keys import KEYS

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
