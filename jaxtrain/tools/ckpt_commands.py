"""The `python -m jaxtrain.ckpt` commands ls, diff, verify and export (ckpt.py parses the command
line and calls them; show and the text every command draws are ckpt_show.py's). Each returns the
exit status."""

import os
from pathlib import Path

from jaxtrain.tools.ckpt_show import (
    field_list_lines,
    human_bytes,
    is_llmc_run,
    number,
    print_json,
    table,
    when_written as _when,
)
from jaxtrain.tools.command_line import EXIT_FINDINGS, EXIT_OK

PROG = 'python -m jaxtrain.ckpt'  # in messages; also `jaxtrain ckpt`
# The commands import ckpt_inspect (and with it JAX) inside their functions, so that main() can
# choose the platform first and --help answers at once.


# --- ls ----------------------------------------------------------------------------------


def _loss_cell(entry: dict) -> str:
    """The step's loss as the step line prints it, else InfiniTrain PR's running minimum, marked 'best'."""
    if entry.get('loss') is not None:
        return f"{entry['loss']:.6f}"
    if entry.get('best_loss') is not None:
        return f"best {entry['best_loss']:.6f}"
    return 'n/a'


def _kept_best(entries) -> set:
    """The step directories --keep_best keeps: the N lowest validation losses among the steps of the
    newest step's lineage, N from that step's run (InfiniTrain PR's checkpoint_final, a copy, is
    never one of them)."""
    from jaxtrain.checkpoint.keep import best_steps

    committed = [
        e
        for e in entries
        if e.get('committed') and e.get('step') is not None and not e['path'].endswith('checkpoint_final')
    ]
    if not committed:
        return set()
    recorded = [e for e in committed if 'keep_best' in e]  # the newest run's whose record is intact
    if not recorded:
        return set()
    newest = max(recorded, key=lambda e: e['step'])
    ranked = [e for e in recorded if e.get('lineage') == newest.get('lineage')]
    steps = best_steps({e['step']: e.get('val_loss') for e in ranked}, newest['keep_best'])
    return {e['path'] for e in committed if e['step'] in steps}


def _llmc_ls(args) -> int:
    from jaxtrain.checkpoint.formats.llmc_run import inspection as ckpt_llmc

    listed = ckpt_llmc.ls(args.dir)
    if args.json:
        print_json(listed)
    else:
        print(ckpt_llmc.ls_text(listed, table, number))
    return EXIT_OK


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
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect

    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    if is_llmc_run(args.dir):
        return _llmc_ls(args)
    entries, latest = ckpt_inspect.list_checkpoints(args.dir)
    entries = ckpt_infinitrain.annotate_entries(
        args.dir, entries, _validation
    )  # kind and loss; InfiniTrain dirs
    latest = ckpt_infinitrain.latest_step(entries, latest)
    best = _kept_best(entries)
    if args.json:
        print_json(
            {
                'root': str(args.dir),
                'latest': latest,
                'checkpoints': [
                    {**e, 'latest': ckpt_infinitrain.is_latest(e, latest), 'kept_best': e['path'] in best}
                    for e in entries
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
            human_bytes(e['size_bytes']),
            _when(e['written_at']) + ('' if e['written_from'] == 'trainer_state' else ' (mtime)'),
            'yes' if e['has_optimizer_state'] else 'no',
            _loss_cell(e),
            ', '.join(
                (['latest'] if ckpt_infinitrain.is_latest(e, latest) else [])
                + ([f"best (val {e['val_loss']:.6f})"] if e['path'] in best else [])
            ),
        ]
        for e in entries
    ]
    print(table(['step', 'directory', 'kind', 'state', 'size', 'written', 'optimizer', 'loss', ''], rows))
    packed = [e for e in entries if e['status'].startswith('gzipped')]
    if packed:
        print(f"{len(packed)} step(s) hold gzipped InfiniTrain files: gunzip {args.dir}/*/*.gz to use them")
    if latest is None:
        print(f'latest: none (no committed checkpoint in {args.dir})')
    else:
        kind = next(e['kind'] for e in entries if ckpt_infinitrain.is_latest(e, latest))
        flag = '' if kind == 'orbax' else f" --checkpoint_format {kind.replace('-pth', '-bin')}"
        print(f'latest: step {latest} (what --resume_from latest --checkpoint_dir {args.dir}{flag} picks)')
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
        rows.append([t['name'], t['status'], number(t.get('max_abs_diff')), number(t.get('max_rel_diff'))])
    for item, count in counted.items():
        side, other = one_sided[item], 'B' if one_sided[item] == 'A' else 'A'
        rows.append([f'{item}/ ({count} tensors)', f'only in {side}: {other} has no {item}', '', ''])
    return rows


def _llmc_run_refused(path, command: str, to: str):
    """The one line for an llm.c run folder (or its model file) given to a command that reads Orbax and
    InfiniTrain steps only: its model file is an llm.c file already, which llmc_io converts."""
    from jaxtrain.checkpoint.formats.llmc_run.restore import locate
    from jaxtrain.checkpoint.layout import CheckpointError
    from llmc_io import llmc_run

    model = llmc_run.model_path(*locate(path))
    return CheckpointError(
        f'{path}: expected an Orbax or InfiniTrain step directory for {command}, found an llm.c run '
        f'folder (ckpt ls, show and verify read those); its model file '
        f'converts with: python -m llmc_io convert {model} OUT{" --to hf" if to else ""}, and '
        f'--init_from {model} starts a run from it'
    )


def cmd_diff(args) -> int:
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect
    from jaxtrain.checkpoint.trainer_state import read_trainer_state

    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    from jaxtrain.checkpoint import registry

    for side in (args.a, args.b):
        if is_llmc_run(side):
            raise _llmc_run_refused(side, 'ckpt diff', '')
        registry.for_step_dir(side)  # refuses a gzipped InfiniTrain step, as every way in does
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
    fields, one_side = ckpt_inspect.recorded_by_one_side(ckpt_inspect.config_differences(state_a, state_b))
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
        lacking = [f[0] for f in one_side if f[index] == ckpt_inspect.ABSENT]
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
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect

    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    from jaxtrain.checkpoint import registry

    kind, root = ckpt_infinitrain.kind_of(args.step_dir), None
    if is_llmc_run(args.step_dir):
        kind, step_dir = 'llmc', Path(args.step_dir)
    elif kind == 'orbax':
        try:
            step_dir = ckpt_inspect.find_step_dir(args.step_dir)
        except ckpt_inspect.CheckpointError:
            newest = registry.newest_step(args.step_dir) if Path(args.step_dir).is_dir() else None
            if newest is None:
                raise
            # A root, as --init_from and generate take one: its newest committed step of any kind.
            (step_dir, fmt), root = newest, args.step_dir
            kind = fmt.name
    else:
        step_dir = Path(args.step_dir)
    result = registry.verify(step_dir)  # the same function every way into a checkpoint calls
    ok = not result.problems
    if root is not None and not args.json:
        print(f'{root}: a checkpoint root; verifying its newest committed step, {Path(step_dir).name}')
    if args.json:
        print_json(
            {
                **({'root': str(root)} if root is not None else {}),
                'path': str(step_dir),
                'kind': kind,
                'ok': ok,
                'problems': result.problems,
                'checked': result.checked,
            }
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
    from jaxtrain.checkpoint.formats.orbax import inspection as ckpt_inspect

    from jaxtrain.checkpoint.formats.infinitrain import export as infinitrain_export
    from jaxtrain.checkpoint.formats.infinitrain import inspection as ckpt_infinitrain

    from jaxtrain.checkpoint import registry
    from jaxtrain.checkpoint.export_target import refuse_output_in_input, refuse_run_sources

    if args.format != 'hf' and (args.dtype or args.max_shard_size or args.check):
        from jaxtrain.checkpoint.layout import CheckpointError

        flag = '--dtype' if args.dtype else '--max_shard_size' if args.max_shard_size else '--check'
        raise CheckpointError(
            f'{flag}: expected --format hf, the only format it applies to, found --format {args.format}'
        )

    topology = infinitrain_export.topology_from_args(args)
    refuse_output_in_input(args.output, args.step_dir)
    refuse_run_sources(args.output, args.step_dir)
    if args.format == 'hf' and args.version is not None:  # the flags first, then the checkpoint
        from jaxtrain.checkpoint.layout import CheckpointError

        raise CheckpointError(f'--version: expected none with --format hf (--dtype), found {args.version}')
    source = args.step_dir
    if ckpt_infinitrain.kind_of(source) == 'orbax' and not is_llmc_run(source):
        source = ckpt_inspect.find_finished_step_dir(source)
    registry.refuse_damaged(source, 'ckpt export')  # as every way into a checkpoint does
    if is_llmc_run(source):
        raise _llmc_run_refused(
            source, f'ckpt export --format {args.format}', 'hf' if args.format == 'hf' else ''
        )
    if args.format == 'llmc-run':
        from jaxtrain.checkpoint.formats.llmc_run import export as ckpt_llmc_export

        written = ckpt_llmc_export.export(args.step_dir, args.output, args.force, args.version or 5)
        if args.json:
            print_json({'path': str(args.step_dir), **written})
        else:
            print(ckpt_llmc_export.export_line(written))
        return EXIT_OK
    if args.format in ('infinitrain', 'infinitrain-lrs', 'infinitrain-bin'):
        if args.version is not None:
            from jaxtrain.checkpoint.layout import CheckpointError

            raise CheckpointError(
                f'--version: expected none with --format {args.format} (InfiniTrain reads fp32 only), '
                f'found {args.version}'
            )
        written = infinitrain_export.export(args.step_dir, args.output, args.format, args.force, topology)
        if args.json:
            print_json({'path': str(args.step_dir), **written})
        else:
            print(infinitrain_export.export_line(written))
        return EXIT_OK
    if ckpt_infinitrain.kind_of(args.step_dir) != 'orbax':
        raise ckpt_infinitrain.CheckpointError(
            f'{args.step_dir}: expected an Orbax checkpoint for --format {args.format}, found an '
            'InfiniTrain one; '
            'its PR generation already holds an llm.c model.bin (export --format infinitrain-bin)'
        )
    step_dir = ckpt_inspect.find_finished_step_dir(args.step_dir)
    if args.format == 'hf':
        written = ckpt_export.export_hf(
            step_dir,
            args.output,
            args.merge_lora,
            args.base,
            args.force,
            args.tokenizer,
            args.dtype or 'float32',
            args.max_shard_size,
        )
        if args.check:
            from jaxtrain.tools.hf_check import check_hf, check_line

            written['check'] = check_hf(args.output, str(step_dir))
        if args.json:
            print_json({'path': str(step_dir), **written})
        else:
            files = ', '.join(os.path.basename(f) for f in written['files'])
            print(
                f"wrote {written['output']}: {written['model_family']} as a Hugging Face folder ({files}, "
                f"{written['dtype']}), {written['num_parameters']:,} parameters, "
                f"{human_bytes(written['size_bytes'])}; "
                f"load it with {written['hf_class']}.from_pretrained"
            )
            if args.check:
                print(check_line(args.output, written['check']))
        return EXIT_OK if not args.check or written['check']['max_abs_diff'] <= 0.05 else EXIT_FINDINGS
    written = ckpt_export.export_llmc(
        step_dir, args.output, args.version or 3, args.merge_lora, args.base, args.force
    )
    if args.json:
        print_json({'path': str(step_dir), **written})
        return EXIT_OK
    print(
        f"wrote {written['output']}: {written['model_family']} llm.c file, version {written['version']} "
        f"({written['dtype']}), {written['num_parameters']:,} parameters, "
        f"{human_bytes(written['size_bytes'])}; "
        f"train from it with --llmc_filepath {written['output']}"
    )
    for note in written['notes']:
        print(f'note: {note}')
    return EXIT_OK


# --- the command line --------------------------------------------------------------------
