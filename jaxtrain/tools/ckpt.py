"""Read jaxtrain checkpoints from a shell: list, show, diff, verify, export to llm.c.

    python -m jaxtrain.ckpt ls CHECKPOINT_DIR
    python -m jaxtrain.ckpt show STEP_DIR [--tensors]
    python -m jaxtrain.ckpt diff STEP_DIR_A STEP_DIR_B
    python -m jaxtrain.ckpt verify STEP_DIR
    python -m jaxtrain.ckpt export STEP_DIR --output model.bin [--version 3|5]

STEP_DIR is one `checkpoint_step_NNNNNN` directory (checkpoint.py describes the layout). Every
command takes --json (for machines; a table for people otherwise) and --verbose (a traceback with
errors). No model is built and no accelerator is needed: JAX runs on the CPU unless JAX_PLATFORMS
says otherwise, and arrays are read as NumPy whatever number of devices saved them.

Exit status: 0 fine (diff: identical, i.e. every tensor bit-equal and the model config equal;
verify: no problem); 1 diff found a difference or verify found problems; 2 an error (no such path,
not a checkpoint, a root where a step directory is expected, a damaged item, a bad argument).
"""

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import sys
import traceback

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2  # findings: diff saw a difference, verify a problem
PROG = 'python -m jaxtrain.ckpt'
TENSOR_COLUMNS = ('item', 'tensor', 'shape', 'dtype', 'sharding', 'min', 'max', 'mean', 'std', 'checksum', '')
# The commands import ckpt_inspect (and with it JAX) inside their functions, so that main() can
# choose the platform first and --help answers at once.


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in one line and exit status 2 like every other error."""

    def error(self, message):
        print(f'{self.prog}: error: {message} (see --help)', file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


# --- rendering -------------------------------------------------------------------------


def _table(headers, rows: list[list]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ['  '.join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ['  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return '\n'.join(lines)


def _number(x) -> str:
    if x is None:
        return 'n/a'
    return f'{x:.6g}' if isinstance(x, float) else str(x)


def _json_safe(value):
    """Strict JSON: NaN and infinities become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _print_json(value):
    print(json.dumps(_json_safe(value), indent=2, default=str))


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime('%Y-%m-%d %H:%M:%S')


def _bytes(n: int) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024


# --- ls ----------------------------------------------------------------------------------


def cmd_ls(args) -> int:
    from jaxtrain.tools import ckpt_inspect

    entries, latest = ckpt_inspect.list_checkpoints(args.dir)
    if args.json:
        _print_json(
            {
                'root': str(args.dir),
                'latest': latest,
                'checkpoints': [
                    {**dataclasses.asdict(e), 'path': str(e.path), 'latest': e.committed and e.step == latest}
                    for e in entries
                ],
            }
        )
        return EXIT_OK
    rows = [
        [
            e.step,
            e.path.name,
            e.status,
            _bytes(e.size_bytes),
            _when(e.written_at) + ('' if e.written_from == 'trainer_state' else ' (mtime)'),
            'yes' if e.has_optimizer_state else 'no',
            '-' if e.loss is None else f'{e.loss:.6f}',
            'latest' if e.committed and e.step == latest else '',
        ]
        for e in entries
    ]
    print(_table(['step', 'directory', 'state', 'size', 'written', 'optimizer', 'loss', ''], rows))
    if latest is None:
        print(f'latest: none (no committed checkpoint in {args.dir})')
    else:
        print(f"latest: step {latest} (what --resume_from latest --checkpoint_dir {args.dir} picks)")
    return EXIT_OK


# --- show --------------------------------------------------------------------------------


def _tensor_rows(step_dir, state: dict) -> list[dict]:
    from jaxtrain.tools import ckpt_inspect

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


def _show_text(step_dir, state: dict) -> str:
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
        ('step', state.get('step')),
        ('data position', position),
        ('learning rate', f"{state.get('learning_rate')} (for the next step)"),
        ('saved at', _when(state['saved_at']) if 'saved_at' in state else 'n/a'),
        ('optimizer state', 'saved' if state.get('has_optimizer_state') else 'not saved'),
        ('model', f"{state.get('model_family')}: {model}"),
        ('dtype', state.get('dtype')),
        ('topology', devices),
        ('versions', versions),
        ('llmc source', f"{llmc} (sha256 {state.get('llmc_sha256')})" if llmc else 'none (random init)'),
    ]
    width = max(len(k) for k, _ in lines)
    text = [f'{k.ljust(width)}  {v}' for k, v in lines]
    training = state.get('training_config') or {}
    if training:
        text.append('training config')
        key_width = max(len(k) for k in training)
        text += [f'  {k.ljust(key_width)}  {v!r}' for k, v in sorted(training.items())]
    return '\n'.join(text)


def cmd_show(args) -> int:
    from jaxtrain.tools import ckpt_inspect
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    step_dir = ckpt_inspect.find_finished_step_dir(args.step_dir)
    state = read_trainer_state(step_dir)
    rows = _tensor_rows(step_dir, state) if args.tensors else None
    if args.json:
        shown = {'path': str(step_dir), 'trainer_state': {k: v for k, v in state.items() if k != 'checksums'}}
        if rows is not None:
            shown['tensors'] = rows
        _print_json(shown)
        return EXIT_OK
    print(_show_text(step_dir, state))
    if rows is not None:
        table = [
            [
                r['item'],
                r['name'],
                ('x'.join(map(str, r['shape'])) or '()') if 'shape' in r else '',
                r.get('dtype', ''),
                r.get('sharding', ''),
                *(_number(r.get(k)) for k in ('min', 'max', 'mean', 'std')),
                r['checksum'],
                r['checksum_status'],
            ]
            for r in rows
        ]
        print()
        print(_table(TENSOR_COLUMNS, table))
        bad = [r for r in rows if r['checksum_status'] != 'ok']
        print(f'checksums: {len(rows) - len(bad)} of {len(rows)} ok' + ('' if not bad else ' (see verify)'))
    return EXIT_OK


# --- diff --------------------------------------------------------------------------------


def _one_sided_items_summarised(changed: list[dict], one_sided: dict) -> list[list]:
    """Table rows of the differing tensors, with an item that only one side saved (the
    optimizer state of a params-only checkpoint) as one row instead of one per tensor."""
    rows, counted = [], {}
    for t in changed:
        item = t['name'].split('/', 1)[0]
        if item in one_sided:
            counted[item] = counted.get(item, 0) + 1
            continue
        rows.append([t['name'], t['status'], _number(t.get('max_abs_diff')), _number(t.get('max_rel_diff'))])
    for item, count in counted.items():
        side, other = one_sided[item], 'B' if one_sided[item] == 'A' else 'A'
        rows.append([f'{item}/ ({count} tensors)', f'only in {side}: {other} has no {item}', '', ''])
    return rows


def cmd_diff(args) -> int:
    from jaxtrain.tools import ckpt_inspect
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    step_a, step_b = ckpt_inspect.find_finished_step_dir(args.a), ckpt_inspect.find_finished_step_dir(args.b)
    state_a, state_b = read_trainer_state(step_a), read_trainer_state(step_b)
    fields = ckpt_inspect.config_differences(state_a, state_b)
    tensors = []
    one_sided = {}  # item -> the side that has it ('A' or 'B'), e.g. opt_state of a params-only save
    for item in ckpt_inspect.ARRAY_ITEMS:
        # An item on one side only (opt_state not saved) lists all its tensors as one-sided.
        sides = [
            ckpt_inspect.read_tensors(s, item) if (s / item).is_dir() else None for s in (step_a, step_b)
        ]
        if sides != [None, None]:
            tensors += ckpt_inspect.compare_tensors(item, sides[0] or {}, sides[1] or {})
        if (sides[0] is None) != (sides[1] is None):
            one_sided[item] = 'A' if sides[0] is not None else 'B'

    model_equal = not any(f.startswith(('model_config.', 'model_family')) for f, _, _ in fields)
    identical = model_equal and all(t['status'] == 'identical' for t in tensors)
    if args.json:
        _print_json(
            {
                'a': str(step_a),
                'b': str(step_b),
                'identical': identical,
                'fields': [{'field': f, 'a': a, 'b': b} for f, a, b in fields],
                'tensors': tensors,
            }
        )
        return EXIT_OK if identical else EXIT_FINDINGS
    print(f'A: {step_a}\nB: {step_b}')
    if fields:
        print(_table(['field', 'A', 'B'], [[f, repr(a), repr(b)] for f, a, b in fields]))
    else:
        print('configs: identical (step, data position, model and training config)')
    changed = [t for t in tensors if t['status'] != 'identical']
    if changed:
        print()
        print(
            _table(
                ['tensor', 'status', 'max abs diff', 'max rel diff'],
                _one_sided_items_summarised(changed, one_sided),
            )
        )
    print(f'tensors: {len(tensors) - len(changed)} of {len(tensors)} bit-identical')
    print('identical' if identical else 'different' + ('' if model_equal else ' (model config differs)'))
    return EXIT_OK if identical else EXIT_FINDINGS


# --- verify ------------------------------------------------------------------------------


def cmd_verify(args) -> int:
    from jaxtrain.tools import ckpt_inspect

    step_dir = ckpt_inspect.find_step_dir(args.step_dir)
    result = ckpt_inspect.verify(step_dir)
    ok = not result.problems
    if args.json:
        _print_json({'path': str(step_dir), 'ok': ok, 'problems': result.problems, 'checked': result.checked})
    elif ok:
        print(f'OK: {step_dir}: ' + '; '.join(result.checked))
    else:
        print(f'FAILED: {step_dir}: {len(result.problems)} problem(s)')
        print('\n'.join(f'  {p}' for p in result.problems))
    return EXIT_OK if ok else EXIT_FINDINGS


# --- export ------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from jaxtrain.tools import ckpt_export
    from jaxtrain.tools import ckpt_inspect

    step_dir = ckpt_inspect.find_finished_step_dir(args.step_dir)
    written = ckpt_export.export_llmc(step_dir, args.output, args.version)
    if args.json:
        _print_json({'path': str(step_dir), **written})
        return EXIT_OK
    print(
        f"wrote {written['output']}: {written['model_family']} llm.c file, version {written['version']} "
        f"({written['dtype']}), {written['num_parameters']:,} parameters, {_bytes(written['size_bytes'])}; "
        f"train from it with --llmc_filepath {written['output']}"
    )
    for note in written['notes']:
        print(f'note: {note}')
    return EXIT_OK


# --- the command line --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--verbose', action='store_true', help='print a traceback with errors')
    # Also accepted after the command; SUPPRESS keeps the top-level value when it is not given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--json', action='store_true', help='machine-readable output (JSON on stdout)')
    common.add_argument(
        '--verbose', action='store_true', default=argparse.SUPPRESS, help='traceback with errors'
    )
    commands = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    ls = commands.add_parser(
        'ls',
        parents=[common],
        help='the checkpoints under a root',
        description='Every checkpoint step directory under a root: step, committed or not (an Orbax '
        'temporary directory is a save that never finished), size, when written, whether it holds '
        "the optimizer state, and which one '--resume_from latest' would pick.",
    )
    ls.add_argument('dir', metavar='CHECKPOINT_DIR', help='the root (the run\'s --checkpoint_dir)')
    ls.set_defaults(run=cmd_ls)

    show = commands.add_parser(
        'show',
        parents=[common],
        help='the trainer state of one checkpoint (and its tensors)',
        description='The trainer state of one checkpoint: step, data position, model and training '
        'config, dtype, topology, versions, llm.c source. With --tensors, one row per tensor of params '
        'and opt_state: shape, dtype, sharding it was saved with, statistics, checksum (recomputed '
        'and compared with the recorded one).',
    )
    show.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    show.add_argument('--tensors', action='store_true', help='also read every tensor (slower)')
    show.set_defaults(run=cmd_show)

    diff = commands.add_parser(
        'diff',
        parents=[common],
        help='compare two checkpoints',
        description='Configs field by field and every tensor (max abs and max relative difference). '
        'Exit 0 when identical: every tensor bit-equal on both sides and the model config equal; '
        'otherwise 1. Other config differences (paths, step) are listed but do not count.',
    )
    diff.add_argument('a', metavar='STEP_DIR_A')
    diff.add_argument('b', metavar='STEP_DIR_B')
    diff.set_defaults(run=cmd_diff)

    verify = commands.add_parser(
        'verify',
        parents=[common],
        help='check one checkpoint completely',
        description='Every item present (params, trainer_state; opt_state when has_optimizer_state), '
        'the JSON readable, every tensor checksum equal to the recorded one, and the params shaped as '
        'the model config implies. Exit 0 when all is well, 1 with the list of problems otherwise.',
    )
    verify.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    verify.set_defaults(run=cmd_verify)

    export = commands.add_parser(
        'export',
        parents=[common],
        help='write the params as an llm.c model file',
        description='Write the params as an llm.c file that --llmc_filepath reads: GPT-2 in llm.c\'s '
        'layout (head tied to wte; version 3 fp32 or 5 bf16), LLaMA-3 in InfiniTrain\'s layout '
        '(version 3 only). The params are verified against their checksums first.',
    )
    export.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    export.add_argument('--output', required=True, metavar='FILE', help='the llm.c file to write')
    export.add_argument(
        '--version', type=int, choices=(3, 5), default=3, help='3: fp32 (default); 5: bf16, GPT-2 only'
    )
    export.set_defaults(run=cmd_export)
    return parser


@contextlib.contextmanager
def _quiet_absl():
    """Orbax logs warnings (e.g. no per-item _CHECKPOINT_METADATA) that are normal here."""
    logger = logging.getLogger('absl')
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Reading a checkpoint needs no accelerator: do not claim (or wait for) a GPU unless asked to.
    # JAX reads this when imported, which the commands do (through ckpt_inspect) after this line.
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    try:
        with _quiet_absl():
            return args.run(args)
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001  one line for people, whatever failed; the traceback on request
        if args.verbose:
            traceback.print_exc()
        text = str(e).strip()
        message = text.splitlines()[0] if text else type(e).__name__
        from jaxtrain.checkpoint.layout import CheckpointError

        kind = '' if isinstance(e, CheckpointError) else f' ({type(e).__name__})'
        print(f'{PROG} {args.command}: error: {message}{kind}', file=sys.stderr)
        return EXIT_ERROR


if __name__ == '__main__':
    sys.exit(main())
