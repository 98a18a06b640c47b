"""The text checkpoints are told in, one way for every format.

How `ckpt` draws what it read for people (--json prints the data itself): a table's columns,
numbers, sizes and times, for every format's listing and show.

The [CKPT] lines InfiniTrain prints around saves and loads (infini_train/src/checkpoint/checkpoint.cc
at b24d92f), written alike by every format so that a run's log diffs against upstream's.
"""

from __future__ import annotations

import datetime


def when_written(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime('%Y-%m-%d %H:%M:%S')


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


def human_bytes(n: int) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024


def _cpp_path(path) -> str:
    """A path as C++'s `operator<<(std::filesystem::path)` prints it (std::quoted)."""
    text = str(path).replace('\\', '\\\\').replace('"', '\\"')
    return f'"{text}"'


def _cpp_float(value: float) -> str:
    """A double as a default-formatted C++ ostream prints it (%g, 6 significant digits)."""
    return f'{value:g}'


def ckpt_save_begin_line(step_dir, step: int) -> str:
    return f'[CKPT] Save begin: dir={_cpp_path(step_dir)}, global_step={step}'


def ckpt_loading_lr_scheduler_line(path) -> str:
    return f'[CKPT] Loading LR scheduler: {_cpp_path(path)}'


def ckpt_save_done_line(step_dir) -> str:
    return f'[CKPT] Save done: dir={_cpp_path(step_dir)}'


def ckpt_load_done_line(trainer_state: dict, sequence_parallel: bool | None = None) -> str:
    """From our trainer state: consumed_batches counts InfiniTrain's loader batches (rows of
    batch_size sequences) that the saved steps read, across all data-parallel ranks. The topology is
    the checkpoint's, as upstream prints the loaded trainer_state: an InfiniTrain file's own sizes
    (`infinitrain_sizes`, with cp when the file has it: feat/context_parallel d03ba16), else our mesh,
    pipeline stages and sequence-parallel setting (cp with a context axis)."""
    config = trainer_state.get('training_config', {})
    rows = config.get('batch_size', 1) * config.get('sequence_length', 1)
    consumed = trainer_state.get('data_position', 0) * trainer_state.get('tokens_per_step', rows) // rows
    sizes = trainer_state.get('infinitrain_sizes')
    if sizes is None:
        topology = trainer_state.get('topology', {})
        mesh = topology.get('mesh', {})
        tp = mesh.get('tensor', 1)
        if sequence_parallel is None:
            sequence_parallel = bool(config.get('sequence_parallel', False))
        sizes = {
            'ddp': mesh.get('data', 1) * mesh.get('fsdp', 1),
            'tp': tp,
            'sp': tp if sequence_parallel else 1,
            'pp': topology.get('pp_size', 1),
        }
        if mesh.get('context', 1) > 1:  # feat/context_parallel d03ba16 checkpoint.cc:108-109
            sizes['cp'] = mesh['context']
    names = ('ddp', 'tp', 'sp', 'cp', 'pp') if sizes.get('cp') is not None else ('ddp', 'tp', 'sp', 'pp')
    # The LR-scheduler generation (InfiniTrain PR 151) keeps no last_lr and prints none.
    learning_rate = trainer_state.get('learning_rate', 0.0)
    last_lr = '' if learning_rate is None else f'last_lr={_cpp_float(learning_rate)}, '
    return (
        f"[CKPT] Load done: global_step={trainer_state.get('step', 0)}, consumed_batches ={consumed}, "
        f"{last_lr}topology({','.join(names)})=({','.join(str(sizes[n]) for n in names)})"
    )
