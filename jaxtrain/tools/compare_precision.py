"""Where two runs first differ: compares the logs two runs wrote with `--precision_check`
step by step and tensor by tensor, in the order the run wrote them, and names the first step
and module whose tensor differs.

  python -m jaxtrain.compare_precision RUN_A RUN_B [--rtol 0] [--atol 0]

RUN_A/RUN_B: a precision_check_rank_R.log, its timestamped folder, or the --precision_check
path (its newest timestamped folder). simple-format lines compare min, max, mean, the first
values and the NaN/Inf counts within rtol/atol (default: exactly); md5 lines compare the md5.
Exit status 0 when nothing differs, 1 at the first difference, 2 on bad input.
"""

import argparse
import re
import sys
from pathlib import Path

from jaxtrain.tools.command_line import program_name, reader_gone

TENSOR_LINE = re.compile(r'^(\[GAS-\d+\] \[L-\d+\]) (\S+) tensor\[\d+\]: (.*)$')
NUMBER = re.compile(r'[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)', re.IGNORECASE)


def find_log(path: Path, rank: int) -> Path:
    if path.is_file():
        return path
    name = f'precision_check_rank_{rank}.log'
    if (path / name).is_file():
        return path / name
    runs = sorted(p for p in path.glob(f'*/{name}')) if path.is_dir() else []
    if not runs:
        raise FileNotFoundError(f'{path}: expected a {name}, or a folder holding one; found none')
    return runs[-1]  # timestamped YYYYMMDD_HHMMSS: the newest sorts last


def read_log(path: Path) -> list[tuple[int, str, str, str]]:
    """[(step, context, tensor name, fields)] in file order."""
    rows, step = [], 0
    for line in path.read_text().splitlines():
        if line.startswith('[STEP '):
            step = int(line[6:].rstrip(']'))
            continue
        match = TENSOR_LINE.match(line)
        if match:
            rows.append((step, *match.groups()))
    return rows


def fields_differ(a: str, b: str, rtol: float, atol: float) -> bool:
    if 'md5=' in a or 'md5=' in b or not (rtol or atol):
        return a != b
    left, right = NUMBER.findall(a), NUMBER.findall(b)
    if len(left) != len(right) or NUMBER.sub('#', a) != NUMBER.sub('#', b):
        return True
    for x, y in zip(map(float, left), map(float, right)):
        if x != x or y != y:  # NaN: equal only to NaN
            if not (x != x and y != y):
                return True
        elif abs(x - y) > atol + rtol * abs(y):
            return True
    return False


def main(argv=None) -> int:
    try:
        return _compare(argv)
    except BrokenPipeError:  # `| head` has read what it wanted
        return reader_gone()


def _compare(argv) -> int:
    parser = argparse.ArgumentParser(
        prog=program_name('python -m jaxtrain.compare_precision'), description=__doc__.split('\n\n')[0]
    )
    parser.add_argument('run_a', type=Path, help='a precision_check log, its folder, or the path= folder')
    parser.add_argument('run_b', type=Path, help='the same for the other run')
    parser.add_argument('--rank', type=int, default=0, help='which rank_N log to compare (default 0)')
    parser.add_argument('--rtol', type=float, default=0.0, help='relative tolerance (default 0: exact)')
    parser.add_argument('--atol', type=float, default=0.0, help='absolute tolerance (default 0: exact)')
    args = parser.parse_args(argv)
    try:
        logs = [find_log(p, args.rank) for p in (args.run_a, args.run_b)]
    except FileNotFoundError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    a, b = (read_log(log) for log in logs)
    if not a or not b:
        empty = logs[0] if not a else logs[1]
        print(f'error: {empty}: expected precision check lines, found none', file=sys.stderr)
        return 2
    for row_a, row_b in zip(a, b):
        (step_a, ctx_a, name_a, fields_a), (step_b, ctx_b, name_b, fields_b) = row_a, row_b
        if (step_a, ctx_a, name_a) != (step_b, ctx_b, name_b):
            print(
                f'first difference: the runs tapped different tensors at step {step_a}: '
                f'{ctx_a} {name_a} vs step {step_b} {ctx_b} {name_b}'
            )
            return 1
        if fields_differ(fields_a, fields_b, args.rtol, args.atol):
            print(f'first difference: step {step_a}, {name_a} {ctx_a}')
            print(f'  A: {fields_a}')
            print(f'  B: {fields_b}')
            return 1
    if len(a) != len(b):
        longer = 'A' if len(a) > len(b) else 'B'
        print(
            f'first difference: {longer} goes on after the other ends (at step {min(a, b, key=len)[-1][0]})'
        )
        return 1
    print(f'no difference: {len(a)} tensors over {len({row[0] for row in a})} steps')
    return 0


if __name__ == '__main__':
    sys.exit(main())
