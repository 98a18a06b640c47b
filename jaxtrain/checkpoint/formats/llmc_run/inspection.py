"""`ckpt ls / show / verify` on an llm.c run folder (kind `llmc`); `ckpt export --format llmc-run`
writes one (writer.py); `ckpt diff` and
the other exports refuse one, naming the llmc_io command that converts its model file.

A run folder is what `train_gpt2cu -o DIR` writes (llmc_io/llmc_run.py); `show` and `verify` take
RUN_DIR/model_%08d.bin (that step) or RUN_DIR (its newest committed step).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import numpy as np

from jaxtrain.checkpoint.ckpt_text import number, table
from jaxtrain.checkpoint.layout import CheckpointError
from llmc_io import llmc_run
from llmc_io.errors import LLMCFormatError
from llmc_io.llmc_state import tree_to_flat

KIND = 'llmc'


def locate(path) -> tuple[Path, int]:
    """(run folder, step) for RUN_DIR/model_%08d.bin or RUN_DIR (its newest committed step)."""
    path = Path(path).absolute()
    named = llmc_run.split_model_path(path)
    if named is not None:
        return named
    steps = llmc_run.committed_steps(path)
    if not steps:
        raise LLMCFormatError(
            path,
            'DONE_%08d markers',
            'at least one committed step',
            'none',
            'llm.c writes DONE_%08d last; this run folder holds no completed checkpoint',
        )
    return path, steps[-1]


def read_step(path, need_master=False):
    try:
        run_dir, step = locate(path)
        return llmc_run.read_step(run_dir, step, need_master)
    except LLMCFormatError as e:
        raise CheckpointError(str(e)) from None


_MAIN_LOG_LOSS = re.compile(r'^s:(\d+) trl:([-\d.eE+naif]+)')


def _train_losses(run_dir: Path) -> dict[int, float]:
    """{step: train loss} from llm.c's main.log ("s:K trl:X" is the loss of step K + 1)."""
    log = run_dir / 'main.log'
    if not log.is_file():
        return {}
    found = {}
    for line in log.read_text(errors='replace').splitlines():
        if m := _MAIN_LOG_LOSS.match(line):
            found[int(m.group(1)) + 1] = float(m.group(2))
    return found


def ls(run_dir) -> dict:
    run_dir = Path(run_dir)
    committed = set(llmc_run.committed_steps(run_dir))
    steps = sorted(
        committed | {int(p.name[6:14]) for p in run_dir.glob('model_*.bin') if llmc_run.split_model_path(p)}
    )
    losses = _train_losses(run_dir)
    rows = []
    for step in steps:
        files = [llmc_run.model_path(run_dir, step)] + sorted(run_dir.glob(f'state_{step:08d}_*.bin'))
        present = [f for f in files if f.is_file()]
        master = None
        state_file = run_dir / f'state_{step:08d}_00000.bin'
        if state_file.is_file():
            master = (
                bool(np.fromfile(state_file, '<i4', count=5)[4]) if state_file.stat().st_size >= 20 else None
            )
        rows.append(
            {
                'step': step,
                'files': [f.name for f in present],
                'kind': KIND,
                'state': 'committed' if step in committed else 'no DONE marker (incomplete)',
                'size_bytes': sum(f.stat().st_size for f in present),
                'written': max((f.stat().st_mtime for f in present), default=None),
                'master_weights': master,
                'loss': losses.get(step),
            }
        )
    latest = max(committed) if committed else None
    return {'root': str(run_dir), 'kind': KIND, 'latest': latest, 'steps': rows}


def ls_text(listed: dict) -> str:
    rows = []
    for r in listed['steps']:
        when = (
            datetime.datetime.fromtimestamp(r['written']).strftime('%Y-%m-%d %H:%M') if r['written'] else '-'
        )
        master = {True: 'fp32 master', False: 'no master (-w 0)', None: '-'}[r['master_weights']]
        rows.append(
            [
                r['step'],
                ', '.join(r['files']),
                r['kind'],
                r['state'],
                f"{r['size_bytes']:,} B",
                when,
                master,
                '-' if r['loss'] is None else number(r['loss']),
                'latest' if r['step'] == listed['latest'] else '',
            ]
        )
    lines = [table(['step', 'files', 'kind', 'state', 'size', 'written', 'weights', 'loss', ''], rows)]
    if listed['latest'] is not None:
        lines.append(
            f"resume: train_gpt2cu -y 1 -o {listed['root']} (step {listed['latest']}), or "
            f"--resume_from {listed['root']} --shuffle llmc"
        )
    else:
        lines.append(f"{listed['root']}: no committed step (no DONE_%08d marker)")
    return '\n'.join(lines)


def _stats(name, array) -> dict:
    a = np.asarray(array, np.float64)
    return {
        'array': name,
        'values': int(a.size),
        'min': float(a.min()),
        'max': float(a.max()),
        'mean': float(a.mean()),
        'rms': float(np.sqrt(np.mean(a * a))),
    }


def show(path, with_tensors: bool) -> dict:
    ckpt = read_step(path)
    s = ckpt.state
    header = ckpt.header
    shown = {
        'path': str(ckpt.model_path),
        'kind': KIND,
        'step': ckpt.step,
        'model': {
            'file': ckpt.model_path.name,
            'version': ckpt.model_version,
            'dtype': 'bfloat16' if ckpt.model_version == 5 else 'float32',
            'max_seq_len': header.max_seq_len,
            'vocab_size': header.vocab_size,
            'padded_vocab_size': header.padded_vocab_size,
            'num_layers': header.num_layers,
            'num_heads': header.num_heads,
            'channels': header.channels,
            'num_parameters': header.num_parameters,
        },
        'state': {
            'file': ckpt.state_path.name,
            'version': s.version,
            'num_processes': s.num_processes,
            'process_rank': s.process_rank,
            'master_weights': s.use_master_weights,
            'rng_state': s.rng_state,
            'rng_state_last_update': s.rng_state_last_update,
        },
        'loader': {
            'should_shuffle': s.shuffle is not None,
            'current_shard_idx': s.current_shard_idx,
            'current_sample_idx': s.current_sample_idx,
        },
    }
    if s.shuffle is not None:
        shown['loader'].update(
            num_shards=len(s.shuffle.shard_indices),
            shard_indices=s.shuffle.shard_indices.tolist(),
            shard_num_samples=len(s.shuffle.intra_shard_indices),
            intra_shard_indices=s.shuffle.intra_shard_indices.tolist(),
            mt19937={'left': s.shuffle.rng.left, 'next': s.shuffle.rng.next},
        )
    if with_tensors:
        import llmc_io

        arrays = [
            ('model params', tree_to_flat(ckpt.model_path, llmc_io.load_gpt2(ckpt.model_path)[1], header)),
            ('AdamW m', s.m),
            ('AdamW v', s.v),
        ]
        if s.master is not None:
            arrays.append(('master weights', s.master))
        shown['arrays'] = [_stats(name, a) for name, a in arrays]
    return shown


def _short(values: list, keep: int = 16) -> str:
    text = ' '.join(map(str, values[:keep]))
    return text + (f' ... ({len(values)} in all)' if len(values) > keep else '')


def show_text(shown: dict) -> str:
    m, st, ld = shown['model'], shown['state'], shown['loader']
    rows = [
        ('path', shown['path']),
        ('kind', f"{KIND} (llm.c train_gpt2cu run folder)"),
        ('step', shown['step']),
        (
            'model',
            (
                f"{m['file']}: v{m['version']} {m['dtype']}, maxT {m['max_seq_len']}, V {m['vocab_size']}, "
                f"Vp {m['padded_vocab_size']}, L {m['num_layers']}, NH {m['num_heads']}, C {m['channels']}, "
                f"{m['num_parameters']:,} parameters"
            ),
        ),
        (
            'state',
            (
                f"{st['file']}: version {st['version']}, {st['num_processes']} process(es), rank "
                f"{st['process_rank']}"
            ),
        ),
        ('master weights', 'fp32, present' if st['master_weights'] else 'absent (-w 0)'),
        ('rng state', f"{st['rng_state']} (before the last update: {st['rng_state_last_update']})"),
        ('loader position', f"shard position {ld['current_shard_idx']}, sample {ld['current_sample_idx']}"),
    ]
    if ld['should_shuffle']:
        rows += [
            (
                'shuffle',
                f"on: {ld['num_shards']} shard(s), {ld['shard_num_samples']} samples in the current one",
            ),
            ('shard_indices', _short(ld['shard_indices'])),
            ('intra_shard_indices', _short(ld['intra_shard_indices'])),
            ('mt19937', f"left {ld['mt19937']['left']}, next {ld['mt19937']['next']}"),
        ]
    else:
        rows.append(('shuffle', 'off (sequential loader)'))
    width = max(len(k) for k, _ in rows)
    lines = [f'{k.ljust(width)}  {v}' for k, v in rows]
    if 'arrays' in shown:
        lines.append('')
        lines.append(
            table(
                ['array', 'values', 'min', 'max', 'mean', 'rms'],
                [
                    [
                        a['array'],
                        f"{a['values']:,}",
                        number(a['min']),
                        number(a['max']),
                        number(a['mean']),
                        number(a['rms']),
                    ]
                    for a in shown['arrays']
                ],
            )
        )
    return '\n'.join(lines)


def refused(path, command: str, target: str) -> CheckpointError:
    """The one line for an llm.c run folder (or its model file) given to a command that reads Orbax and
    InfiniTrain steps only: its model file is an llm.c file already, which llmc_io converts."""
    model = llmc_run.model_path(*locate(path))
    return CheckpointError(
        f'{path}: expected an Orbax or InfiniTrain step directory for {command}, found an llm.c run '
        f'folder (ckpt ls, show and verify read those); its model file '
        f'converts with: python -m llmc_io convert {model} OUT{" --to hf" if target == "hf" else ""}, and '
        f'--init_from {model} starts a run from it'
    )
