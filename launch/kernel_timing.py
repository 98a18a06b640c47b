"""What the kernel microbenches (cross_entropy_bench.py, attention_bench.py) share: the median
time of a jitted call, and their command line of positional integers."""

import statistics
import sys
import time

import jax


def median_ms(fn, *args, repeats: int = 20) -> float:
    """Median of `repeats` blocked calls of fn(*args), in ms, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(1e3 * (time.perf_counter() - began))
    return statistics.median(times)


def integer_args(doc: str, most: int) -> list[int]:
    """sys.argv's positional integers (at most `most`); --help, or anything else, prints doc."""
    args = sys.argv[1:]
    if any(not a.isdigit() for a in args) or len(args) > most:
        print(doc)
        sys.exit(0 if args in (['-h'], ['--help']) else 2)
    return [int(a) for a in args]
