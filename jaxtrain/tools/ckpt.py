"""Read jaxtrain checkpoints from a shell: list, show, diff, verify, export (to llm.c or InfiniTrain).

    python -m jaxtrain.ckpt ls CHECKPOINT_DIR
    python -m jaxtrain.ckpt show STEP_DIR [--tensors]
    python -m jaxtrain.ckpt diff STEP_DIR_A STEP_DIR_B
    python -m jaxtrain.ckpt verify STEP_DIR
    python -m jaxtrain.ckpt export STEP_DIR --output model.bin [--version 3|5] [--merge-lora [--base FILE]]
    python -m jaxtrain.ckpt export STEP_DIR --format hf --output HF_DIR

STEP_DIR is one `checkpoint_step_NNNNNN` directory: ours (Orbax) or InfiniTrain's (HEAD model.ckpt, PR
model.bin / model.pth, with or without rank_* subdirectories); every command says which kind it read
(tools/ckpt_infinitrain.py), and diff compares across kinds. A LoRA
checkpoint (adapters only; checkpoint/lora_record.py) is shown, verified and diffed like any other
and exported only merged into its base (--merge-lora). Every
command takes --json (for machines; a table for people otherwise) and --verbose (a traceback with
errors). No model is built and no accelerator is needed: JAX runs on the CPU unless JAX_PLATFORMS
says otherwise, and arrays are read as NumPy whatever number of devices saved them.

Exit status: 0 fine (diff: identical, i.e. every tensor bit-equal and the model config equal;
verify: no problem); 1 diff found a difference or verify found problems; 2 an error (no such path,
not a checkpoint, a root where a step directory is expected, a damaged item, a bad argument).
"""

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import sys
import traceback
from pathlib import Path

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

    from jaxtrain.tools import ckpt_infinitrain

    entries, latest = ckpt_inspect.list_checkpoints(args.dir)
    entries = ckpt_infinitrain.annotate_entries(args.dir, entries)  # kind and loss; InfiniTrain dirs
    latest = ckpt_infinitrain.latest_step(entries, latest)
    if args.json:
        _print_json(
            {
                'root': str(args.dir),
                'latest': latest,
                'checkpoints': [
                    {**e, 'latest': ckpt_infinitrain.is_latest(e, latest)} for e in entries
                ],
            }
        )
        return EXIT_OK
    rows = [
        [
            e['step'],
            Path(e['path']).name,
            e['kind'],
            e['status'],
            _bytes(e['size_bytes']),
            _when(e['written_at']) + ('' if e['written_from'] == 'trainer_state' else ' (mtime)'),
            'yes' if e['has_optimizer_state'] else 'no',
            f"{e['loss']:.6f}" if e['loss'] is not None else 'n/a',  # as the step line prints it
            'latest' if ckpt_infinitrain.is_latest(e, latest) else '',
        ]
        for e in entries
    ]
    print(_table(['step', 'directory', 'kind', 'state', 'size', 'written', 'optimizer', 'loss', ''], rows))
    if latest is None:
        print(f'latest: none (no committed checkpoint in {args.dir})')
    else:
        kind = next(e['kind'] for e in entries if ckpt_infinitrain.is_latest(e, latest))
        flag = '' if kind == 'orbax' else f" --checkpoint_format {kind.replace('-pth', '-bin')}"
        print(f'latest: step {latest} (what --resume_from latest --checkpoint_dir {args.dir}{flag} picks)')
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
        ('kind', 'orbax'),
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
    training = state.get('training_config') or {}
    if training:
        text.append('training config')
        key_width = max(len(k) for k in training)
        text += [f'  {k.ljust(key_width)}  {v!r}' for k, v in sorted(training.items())]
    return '\n'.join(text)


def cmd_show(args) -> int:
    from jaxtrain.tools import ckpt_inspect
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    from jaxtrain.tools import ckpt_infinitrain

    if ckpt_infinitrain.kind_of(args.step_dir) != 'orbax':
        return _show_infinitrain(args)
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


def _show_infinitrain(args) -> int:
    from jaxtrain.tools import ckpt_infinitrain

    shown = ckpt_infinitrain.show(Path(args.step_dir), args.tensors)
    if args.json:
        _print_json(shown)
    else:
        print(ckpt_infinitrain.show_text(shown, _table, _number))
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

    from jaxtrain.tools import ckpt_infinitrain

    kinds = [ckpt_infinitrain.kind_of(p) for p in (args.a, args.b)]
    step_a, step_b = (
        ckpt_inspect.find_finished_step_dir(p) if k == 'orbax' else Path(p)
        for p, k in zip((args.a, args.b), kinds)
    )
    one_sided = {}  # item -> the side that has it ('A' or 'B'), e.g. opt_state of a params-only save
    if kinds == ['orbax', 'orbax']:
        state_a, state_b = read_trainer_state(step_a), read_trainer_state(step_b)
        tensors = []
        for item in ckpt_inspect.ARRAY_ITEMS:
            # An item on one side only (opt_state not saved) lists all its tensors as one-sided.
            sides = [
                ckpt_inspect.read_tensors(s, item) if (s / item).is_dir() else None for s in (step_a, step_b)
            ]
            if sides != [None, None]:
                tensors += ckpt_inspect.compare_tensors(item, sides[0] or {}, sides[1] or {})
            if (sides[0] is None) != (sides[1] is None):
                one_sided[item] = 'A' if sides[0] is not None else 'B'
    else:  # across kinds: params and Adam's m, v, t under common names (ckpt_infinitrain.py)
        state_a, state_b = ckpt_infinitrain.record_of(step_a), ckpt_infinitrain.record_of(step_b)
        common = [ckpt_infinitrain.canonical_tensors(s) for s in (step_a, step_b)]
        tensors = ckpt_inspect.compare_tensors('', *common)
        for row in tensors:
            row['name'] = row['name'].lstrip('/')
    fields = ckpt_inspect.config_differences(state_a, state_b)
    model_equal = not any(f.startswith(('model_config.', 'model_family')) for f, _, _ in fields)
    identical = model_equal and all(t['status'] == 'identical' for t in tensors)
    if args.json:
        _print_json(
            {
                'a': str(step_a),
                'b': str(step_b),
                'kinds': kinds,
                'identical': identical,
                'fields': [{'field': f, 'a': a, 'b': b} for f, a, b in fields],
                'tensors': tensors,
            }
        )
        return EXIT_OK if identical else EXIT_FINDINGS
    print(f'A: {step_a} ({kinds[0]})\nB: {step_b} ({kinds[1]})')
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

    from jaxtrain.tools import ckpt_infinitrain

    kind = ckpt_infinitrain.kind_of(args.step_dir)
    if kind == 'orbax':
        step_dir = ckpt_inspect.find_step_dir(args.step_dir)
        result = ckpt_inspect.verify(step_dir)
    else:
        step_dir = Path(args.step_dir)
        result = ckpt_infinitrain.verify(step_dir)
    ok = not result.problems
    if args.json:
        _print_json(
            {'path': str(step_dir), 'kind': kind, 'ok': ok, 'problems': result.problems, 'checked': result.checked}
        )
    elif ok:
        print(f'OK: {step_dir} ({kind}): ' + '; '.join(result.checked))
    else:
        print(f'FAILED: {step_dir} ({kind}): {len(result.problems)} problem(s)')
        print('\n'.join(f'  {p}' for p in result.problems))
    return EXIT_OK if ok else EXIT_FINDINGS


# --- export ------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from jaxtrain.tools import ckpt_export
    from jaxtrain.tools import ckpt_inspect

    from jaxtrain.tools import ckpt_infinitrain

    if args.format in ('infinitrain', 'infinitrain-bin'):
        written = ckpt_infinitrain.export(args.step_dir, args.output, args.format)
        if args.json:
            _print_json({'path': str(args.step_dir), **written})
        else:
            print(ckpt_infinitrain.export_line(written))
        return EXIT_OK
    if ckpt_infinitrain.kind_of(args.step_dir) != 'orbax':
        raise ckpt_infinitrain.CheckpointError(
            f'{args.step_dir}: expected an Orbax checkpoint for --format {args.format}, found an InfiniTrain one; '
            'its PR generation already holds an llm.c model.bin (export --format infinitrain-bin)')
    step_dir = ckpt_inspect.find_finished_step_dir(args.step_dir)
    if args.format == 'hf':
        if args.version is not None:
            from jaxtrain.checkpoint.layout import CheckpointError

            raise CheckpointError(f'--version: expected none with --format hf (fp32), found {args.version}')
        written = ckpt_export.export_hf(step_dir, args.output, args.merge_lora, args.base)
        if args.json:
            _print_json({'path': str(step_dir), **written})
        else:
            files = ', '.join(os.path.basename(f) for f in written['files'])
            print(
                f"wrote {written['output']}: {written['model_family']} as a Hugging Face folder ({files}, "
                f"fp32), {written['num_parameters']:,} parameters, {_bytes(written['size_bytes'])}; "
                f"load it with {written['hf_class']}.from_pretrained"
            )
        return EXIT_OK
    written = ckpt_export.export_llmc(step_dir, args.output, args.version or 3, args.merge_lora, args.base)
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
        description='Every checkpoint step directory under a root: step, kind (orbax, infinitrain, '
        'infinitrain-bin, infinitrain-pth), committed or not (an Orbax temporary directory is a save that '
        'never finished), size, when written, whether it holds the optimizer state, the loss stored with '
        "it, and which one '--resume_from latest' would pick.",
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
        description='Orbax: every item present (params, trainer_state; opt_state when has_optimizer_state), '
        'the JSON readable, every tensor checksum equal to the recorded one, and the params shaped as '
        'the model config implies. InfiniTrain: every file parses, names and shapes fit one model, every '
        'rank directory is there, Adam t equals the step, values finite, and the sha256 jaxtrain recorded '
        'match. Exit 0 when all is well, 1 with the list of problems otherwise.',
    )
    verify.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    verify.set_defaults(run=cmd_verify)

    export = commands.add_parser(
        'export',
        parents=[common],
        help='write the params as an llm.c model file or a Hugging Face folder, or the state as an '
        'InfiniTrain checkpoint',
        description='--format llmc (default): write the params as an llm.c file that --llmc_filepath reads: '
        'GPT-2 in llm.c\'s layout (head tied to wte; version 3 fp32 or 5 bf16), LLaMA-3 in InfiniTrain\'s '
        'layout (version 3 only); the params are verified against their checksums first. --format hf: a '
        'Hugging Face folder. --format infinitrain | infinitrain-bin: write --output (a '
        'checkpoint_step_NNNNNN directory) as InfiniTrain HEAD (model.ckpt, optimizer.ckpt) or PR (llm.c '
        'model.bin, optimizer.bin) files, from any kind.',
    )
    export.add_argument('step_dir', metavar='STEP_DIR', help='a checkpoint_step_NNNNNN directory')
    export.add_argument(
        '--output',
        required=True,
        metavar='PATH',
        help='the llm.c file (llmc), the folder (hf) or the step directory (infinitrain*) to write',
    )
    export.add_argument(
        '--format',
        choices=('llmc', 'hf', 'infinitrain', 'infinitrain-bin'),
        default='llmc',
        help='llmc (default): an llm.c model file; hf: a Hugging Face folder, config.json + '
        'model.safetensors (fp32), for GPT2LMHeadModel / LlamaForCausalLM (GPT-2 head tied); '
        'infinitrain / infinitrain-bin: an InfiniTrain step directory',
    )
    export.add_argument(
        '--version', type=int, choices=(3, 5), default=None, help='3: fp32 (default); 5: bf16, GPT-2 only'
    )
    export.add_argument(
        '--merge-lora',
        action='store_true',
        help="a LoRA checkpoint: fold W + (alpha/r)·B·A into its base model's weights and write those "
        '(a LoRA checkpoint cannot be exported otherwise)',
    )
    export.add_argument(
        '--base',
        metavar='FILE',
        default='',
        help="with --merge-lora: the base llm.c file, when it is no longer where trainer_state's llmc_file "
        'says (its sha256 must match)',
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
