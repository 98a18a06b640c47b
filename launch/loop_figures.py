"""The real loop's own speed, from a run's metrics.jsonl: the median of its step lines after
step SKIP against the wall clock between the records of step SKIP and the last step.

  python launch/loop_figures.py RUN/metrics.jsonl [SKIP=10] [TOKENS_PER_STEP=16384]

Each record's `time` is the wall clock when the loop wrote it, so (t_last - t_SKIP) / steps
is what a user waited per step, saves and every host action included; a step line that left
something out reads faster than this. Prints one line; blocked-by-save figures when saved,
and the extra time of the two steps after each save.
"""

import json
import statistics
import sys


def figures(path: str, skip: int = 10, tokens: int = 16384) -> dict:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = {r['step']: r for r in rows if 'loss' in r}
    last = max(steps)
    if skip not in steps or last <= skip:
        raise SystemExit(f'{path}: expected step records after step {skip}, found steps up to {last}')
    after = [steps[s]['step_ms'] for s in sorted(steps) if s > skip]
    wall_ms = 1e3 * (steps[last]['time'] - steps[skip]['time']) / (last - skip)
    blocked = [1e3 * r['save_blocked_s'] for r in rows if 'save_blocked_s' in r]
    saved = [r['step'] for r in rows if 'save_blocked_s' in r]
    median = statistics.median(after)
    # What a save costs the wall clock beyond its blocked part: the next two steps' lines
    # over the median (the device-side copy and the device-to-host transfer run beside them).
    after_save = [
        round(sum(steps[s + k]['step_ms'] for k in (1, 2)) - 2 * median, 2) for s in saved if s + 2 in steps
    ]
    return {
        'steps': f'{skip + 1}..{last}',
        'median_step_ms': round(median, 3),
        'median_tokens_per_s': round(tokens / median * 1e3),
        'mean_step_ms': round(statistics.fmean(after), 3),
        'wall_ms_per_step': round(wall_ms, 3),
        'wall_tokens_per_s': round(tokens / wall_ms * 1e3),
        'line_sum_over_wall': round(sum(after) / (wall_ms * (last - skip)), 4),
        'save_blocked_ms': [round(b, 2) for b in blocked],
        'two_steps_after_save_extra_ms': after_save,
        'losses_first_last': [steps[min(steps)]['loss'], steps[last]['loss']],
    }


if __name__ == '__main__':
    args = sys.argv[1:]
    if not args or args[0] in ('-h', '--help'):
        print(__doc__)
        sys.exit(0 if args else 2)
    print(json.dumps(figures(args[0], *map(int, args[1:]))))
