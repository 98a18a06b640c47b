"""How `ckpt` draws what it read for people (--json prints the data itself): a table's columns,
numbers, sizes and times, one way for every format's listing and show."""

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
