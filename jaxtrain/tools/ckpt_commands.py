"""The `python -m jaxtrain.ckpt` commands (ckpt.py parses the command line and calls them), each
returning the exit status. None names a kind: the registry picks the step's format
(checkpoint/registry.py), which lists, shows, reads and verifies it, and export_target.TARGETS the
function that writes --format.

`diff` compares any two steps: configs field by field and every tensor, across formats under the
names every format shares (format.CheckpointFormat.diff_view). Long lists of field names (the fields
only one side records) are grouped by their first part and counted past a dozen, each line wrapped.
"""

import json
import math
import textwrap
from pathlib import Path

from jaxtrain.checkpoint.ckpt_text import number, table
from jaxtrain.tools.command_line import EXIT_FINDINGS, EXIT_OK

PROG = 'python -m jaxtrain.ckpt'  # in messages; also `jaxtrain ckpt`
# The commands import the registry (and with it JAX) inside their functions, so that main() can
# choose the platform first and --help answers at once.
WIDTH = 100
LISTED_PER_GROUP = 12


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


# --- ls and show -------------------------------------------------------------------------


def _validation(path) -> dict:
    """{'val_loss', 'keep_best'} a step's record holds (either format), for ckpt ls's best marks; none
    from a record whose digest fails (an edited val_loss is not ranked, as the run does not rank it)."""
    from jaxtrain.checkpoint.keep import intact_record

    record = intact_record(path)
    if record is None:
        return {}
    return {
        'val_loss': record.get('val_loss'),
        'keep_best': int((record.get('training_config') or {}).get('keep_best', 0) or 0),
        'lineage': record.get('lineage'),  # the run's ranking covers its own lineage (checkpoint/keep.py)
    }


def cmd_ls(args) -> int:
    from jaxtrain.checkpoint import registry

    fmt, listed = registry.ls(args.dir, _validation)
    if args.json:
        print_json(listed)
    else:
        print(fmt.ls_text(listed))
    return EXIT_OK


def cmd_show(args) -> int:
    from jaxtrain.checkpoint import registry

    fmt = registry.for_step_dir(args.step_dir)  # refuses a gzipped InfiniTrain step, as every way in does
    shown = fmt.show(fmt.find_step(args.step_dir), args.tensors)
    if args.json:
        print_json(shown)
    else:
        print(fmt.show_text(shown, args.all))
    return EXIT_OK


# --- diff --------------------------------------------------------------------------------

ABSENT = '(absent)'  # a field one trainer state does not hold


def config_differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(field, A's value, B's value) for every differing field of the two trainer states."""
    differences = []
    for key in ('model_family', 'step', 'data_position', 'epoch'):
        if a.get(key, ABSENT) != b.get(key, ABSENT):
            differences.append((key, a.get(key, ABSENT), b.get(key, ABSENT)))
    for section in ('model_config', 'training_config'):
        first, second = a.get(section) or {}, b.get(section) or {}
        for key in sorted(set(first) | set(second)):
            if first.get(key, ABSENT) != second.get(key, ABSENT):
                differences.append((f'{section}.{key}', first.get(key, ABSENT), second.get(key, ABSENT)))
    return differences


def recorded_by_one_side(fields: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """config_differences split into (fields both sides record, fields only one records). A file
    that keeps no config (InfiniTrain's own trainer_state.json holds no model config, data position
    or optimizer) is no evidence of another config: there the tensors' names and shapes decide."""
    one_side = [f for f in fields if ABSENT in (f[1], f[2])]
    return [f for f in fields if f not in one_side], one_side


def compare_tensors(item: str, a: dict, b: dict) -> list[dict]:
    """One row per tensor name on either side: status, and max abs / max relative difference.
    Relative difference is |a-b| / max(|a|, |b|) elementwise: 0 where both are 0, 2 at most.
    Identical means equal bit patterns: NaN equals the same NaN, 0.0 differs from -0.0 (what ==
    gets wrong)."""
    import numpy as np

    rows = []
    for name in sorted(set(a) | set(b)):
        row = {'name': f'{item}/{name}'.lstrip('/')}  # item '': the names every format shares
        if name not in b or name not in a:
            row['status'] = 'only in A' if name in a else 'only in B'
        elif a[name].shape != b[name].shape or a[name].dtype != b[name].dtype:
            row['status'] = (
                f'shape/dtype differ: A {a[name].shape} {a[name].dtype}, B {b[name].shape} {b[name].dtype}'
            )
        else:
            x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
            abs_diff = np.abs(x - y)
            scale = np.maximum(np.abs(x), np.abs(y))
            relative = np.divide(abs_diff, scale, out=np.zeros_like(abs_diff), where=scale > 0)
            row['status'] = 'identical' if a[name].tobytes() == b[name].tobytes() else 'different'
            row['max_abs_diff'] = float(abs_diff.max()) if abs_diff.size else 0.0
            row['max_rel_diff'] = float(relative.max()) if relative.size else 0.0
        rows.append(row)
    return rows


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


def _one_sided_items_summarised(changed: list[dict], one_sided: dict) -> list[list]:
    """Table rows of the differing tensors, with an item that only one side saved (the
    optimizer state of a params-only checkpoint) as one row instead of one per tensor."""
    rows, counted = [], {}
    for t in changed:
        item = t['name'].split('/', 1)[0]
        if item in one_sided:
            counted[item] = counted.get(item, 0) + 1
            continue
        rows.append([t['name'], t['status'], number(t.get('max_abs_diff')), number(t.get('max_rel_diff'))])
    for item, count in counted.items():
        side, other = one_sided[item], 'B' if one_sided[item] == 'A' else 'A'
        rows.append([f'{item}/ ({count} tensors)', f'only in {side}: {other} has no {item}', '', ''])
    return rows


def cmd_diff(args) -> int:
    from jaxtrain.checkpoint import registry

    formats = []
    for side in (args.a, args.b):
        fmt = registry.for_step_dir(side)  # refuses a gzipped InfiniTrain step, as every way in does
        fmt.refuse_as_source(side, 'ckpt diff')
        formats.append(fmt)
    step_a, step_b = (fmt.find_step(p) for fmt, p in zip(formats, (args.a, args.b)))
    kinds = [fmt.name for fmt in formats]
    # Two steps of one format compare item by item; across formats, under the names they share.
    common = formats[0] is not formats[1]
    (state_a, items_a), (state_b, items_b) = (
        fmt.diff_view(step, common) for fmt, step in zip(formats, (step_a, step_b))
    )
    tensors, one_sided = [], {}  # one_sided: item -> the side that has it, e.g. opt_state of one side
    for item in dict.fromkeys([*items_a, *items_b]):
        sides = [items_a.get(item), items_b.get(item)]
        if sides != [None, None]:
            tensors += compare_tensors(item, sides[0] or {}, sides[1] or {})
        if (sides[0] is None) != (sides[1] is None):
            one_sided[item] = 'A' if sides[0] is not None else 'B'
    fields, one_side = recorded_by_one_side(config_differences(state_a, state_b))
    model_equal = not any(f.startswith(('model_config.', 'model_family')) for f, _, _ in fields)
    identical = model_equal and all(t['status'] == 'identical' for t in tensors)
    if args.json:
        print_json(
            {
                'a': str(step_a),
                'b': str(step_b),
                'kinds': kinds,
                'identical': identical,
                'fields': [{'field': f, 'a': a, 'b': b} for f, a, b in fields],
                'recorded_by_one_side': [{'field': f, 'a': a, 'b': b} for f, a, b in one_side],
                'tensors': tensors,
            }
        )
        return EXIT_OK if identical else EXIT_FINDINGS
    print(f'A: {step_a} ({kinds[0]})\nB: {step_b} ({kinds[1]})')
    if fields:
        print(table(['field', 'A', 'B'], [[f, repr(a), repr(b)] for f, a, b in fields]))
    elif one_side:
        print('configs: identical where both record them')
    else:
        print('configs: identical (step, data position, model and training config)')
    for side, index in (('A', 1), ('B', 2)):
        lacking = [f[0] for f in one_side if f[index] == ABSENT]
        if lacking:
            print(f'not recorded by {side}, so not compared (the tensors are):')
            print('\n'.join(field_list_lines(lacking)))
    changed = [t for t in tensors if t['status'] != 'identical']
    if changed:
        print()
        print(
            table(
                ['tensor', 'status', 'max abs diff', 'max rel diff'],
                _one_sided_items_summarised(changed, one_sided),
            )
        )
    print(f'tensors: {len(tensors) - len(changed)} of {len(tensors)} bit-identical')
    print('identical' if identical else 'different' + ('' if model_equal else ' (model config differs)'))
    return EXIT_OK if identical else EXIT_FINDINGS


# --- verify ------------------------------------------------------------------------------


def cmd_verify(args) -> int:
    from jaxtrain.checkpoint import registry
    from jaxtrain.checkpoint.layout import CheckpointError

    fmt, root = registry.for_step_dir(args.step_dir), None
    try:
        step_dir = fmt.find_step(args.step_dir, finished=False)  # verify says what a save left
    except CheckpointError:
        newest = registry.newest_step(args.step_dir) if Path(args.step_dir).is_dir() else None
        if newest is None:
            raise
        # A root, as --init_from and generate take one: its newest committed step of any kind.
        (step_dir, fmt), root = newest, args.step_dir
    result = registry.verify(step_dir)  # the same function every way into a checkpoint calls
    ok = not result.problems
    if root is not None and not args.json:
        print(f'{root}: a checkpoint root; verifying its newest committed step, {Path(step_dir).name}')
    if args.json:
        print_json(
            {
                **({'root': str(root)} if root is not None else {}),
                'path': str(step_dir),
                'kind': fmt.name,
                'ok': ok,
                'problems': result.problems,
                'checked': result.checked,
            }
        )
    elif ok:
        print(f'OK: {step_dir} ({fmt.name}): ' + '; '.join(result.checked))
    else:
        print(f'FAILED: {step_dir} ({fmt.name}): {len(result.problems)} problem(s)')
        print('\n'.join(f'  {p}' for p in result.problems))
    return EXIT_OK if ok else EXIT_FINDINGS


# --- export ------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from jaxtrain.checkpoint import export_target, registry
    from jaxtrain.checkpoint.layout import CheckpointError

    target = export_target.TARGETS[args.format]
    hf_only = ('--dtype', args.dtype), ('--max_shard_size', args.max_shard_size), ('--check', args.check)
    given = next((flag for flag, value in hf_only if value), None)
    if not target.hf_folder and given:
        hf = export_target.named(lambda t: t.hf_folder)
        raise CheckpointError(
            f'{given}: expected --format {hf}, the only format it applies to, found --format {args.format}'
        )
    export_target.topology_from_args(args)  # the flags first, then the paths, then the checkpoint
    export_target.refuse_output_in_input(args.output, args.step_dir)
    export_target.refuse_run_sources(args.output, args.step_dir)
    if target.hf_folder and args.version is not None:
        raise CheckpointError(
            f'--version: expected none with --format {args.format} (--dtype), found {args.version}'
        )
    fmt = registry.for_step_dir(args.step_dir)
    source = fmt.find_step(args.step_dir)
    registry.refuse_damaged(source, 'ckpt export')  # as every way into a checkpoint does
    fmt.refuse_as_source(source, f'ckpt export --format {args.format}', args.format)
    written, text = export_target.writer(args.format)(fmt, args)
    if args.check:  # a Hugging Face folder (target.hf_folder): its logits against the step's
        from jaxtrain.tools.hf_check import check_hf, check_line

        written['check'] = check_hf(args.output, written['path'])
        text += '\n' + check_line(args.output, written['check'])
    if args.json:
        print_json(written)
    else:
        print(text)
    return EXIT_OK if not args.check or written['check']['max_abs_diff'] <= 0.05 else EXIT_FINDINGS
