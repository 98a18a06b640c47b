"""--trace_steps FIRST-LAST: a jax.profiler trace of those steps of the real loop, summed per kernel.

The loop pipelines its steps (it dispatches step n+1 before it reads step n), so the trace waits
for the device before it starts and again before it stops: it then holds the kernels of the traced
steps and of no others, and the device time per step it reports is theirs. Those two waits, and the
profiler's own cost, are all the trace changes in the run; the host work in between (a save handed
to Orbax, a validation, a sample) is in it as the run does it.

The trace is what jax.profiler writes: an xplane file for TensorBoard's profile plugin and a
Perfetto JSON (open it at ui.perfetto.dev) in TRACE_DIR/plugins/profile/<time>/.

Where a step's device time goes: a jax.profiler trace, summed per kernel.

`python -m jaxtrain.bench ... --profile_steps 3` traces that many steps after the timed
phase and prints the summary (bench/figures.py's `profile` figure). The trace is
the Perfetto JSON that jax.profiler writes beside its xplane file; device kernels are the
events on the rows of processes named like '/device:GPU:0'.
"""

import re
import time
from pathlib import Path
import jax
import collections
import dataclasses
import gzip
import json
import tempfile


def parse_steps(text: str) -> tuple[int, int]:
    """'41-43' -> (41, 43); '41' -> (41, 41). A ValueError names the key and what was found."""
    match = re.fullmatch(r'(\d+)(?:-(\d+))?', text.strip())
    steps = (int(match[1]), int(match[2] or match[1])) if match else None
    if steps is None or not 1 <= steps[0] <= steps[1]:
        raise ValueError(
            'trace_steps: expected FIRST-LAST with 1 <= FIRST <= LAST (e.g. 41-43) or one step, '
            f'found {text!r}'
        )
    return steps


class StepTrace:
    """Starts the trace before step FIRST runs and stops it after step LAST (or at the end)."""

    def __init__(self, steps: str, directory: str, info, process_index: int = 0, process_count: int = 1):
        self.first, self.last = parse_steps(steps) if steps else (None, None)
        root = Path(directory) if directory else None
        # Processes of one host would write the same file names: each its own folder.
        self.root = root / f'process_{process_index}' if root and process_count > 1 else root
        self.info = info
        self._started_at = None  # the first step traced, while the trace runs
        self._wall = 0.0  # perf_counter() when the trace started
        self._done = False

    def before_step(self, step: int, state) -> None:
        """Called before step `step` is dispatched, with the state the step before left."""
        if self.first is None or self._done:
            return
        if self._started_at is None and self.first <= step <= self.last:
            jax.block_until_ready(state)
            self.root.mkdir(parents=True, exist_ok=True)
            self._started_at = step
            self._wall = time.perf_counter()
            jax.profiler.start_trace(str(self.root), create_perfetto_trace=True)
        elif self._started_at is not None and step > self.last:
            self._stop(state, step - 1)

    def finish(self, state, last_step: int) -> None:
        """When the loop ends (all steps run, or a stop): stops a trace still running and sums it."""
        if self._started_at is not None:
            self._stop(state, last_step)

    def abandon(self) -> None:
        """For a run that failed: the profiler is stopped, and nothing is summed."""
        if self._started_at is not None:
            self._started_at, self._done = None, True
            jax.profiler.stop_trace()

    def _stop(self, state, last_step: int) -> None:
        jax.block_until_ready(state)
        wall_s = time.perf_counter() - self._wall
        jax.profiler.stop_trace()
        first, self._started_at, self._done = self._started_at, None, True
        steps = last_step - first + 1
        traces = sorted(self.root.glob(TRACE_GLOB), key=lambda p: p.stat().st_mtime)
        if steps < 1 or not traces:
            self.info(f'trace: no step traced into {self.root}')
            return
        summary = read_trace(traces[-1], steps)
        self.info(
            f'trace: steps {first}-{last_step} ({wall_s * 1e3 / steps:.2f} ms a step, traced) into '
            f'{traces[-1].parent}'
        )
        for line in summary.lines(top=8):
            self.info(f'trace: {line}')


# Where jax.profiler.start_trace(root, create_perfetto_trace=True) puts the Perfetto JSON.
TRACE_GLOB = 'plugins/profile/*/perfetto_trace.json.gz'

# Kernel-name fragments, lower case, tried in this order.
CATEGORIES = (
    ('loss', ('softmax_cross_entropy',)),  # models/vocab_table.py's Pallas kernel
    ('attention', ('cudnn', 'fmha', 'flash', 'sdpa', 'mha_')),
    ('matmul', ('gemm', 'nvjet', 'cutlass', 'xmma', 'sm90_', 'matmul')),
    ('copy', ('memcpy', 'memset', 'copy')),
    ('fusion', ('fusion', 'reduce', 'loop_', 'input_', 'concatenate', 'convert')),
)


@dataclasses.dataclass
class KernelSummary:
    ms_per_step: dict  # kernel name -> ms per step
    calls_per_step: dict  # kernel name -> calls per step

    @property
    def total_ms(self) -> float:
        return sum(self.ms_per_step.values())

    def by_category(self) -> dict:
        totals = collections.Counter()
        for name, ms in self.ms_per_step.items():
            totals[category(name)] += ms
        return dict(totals.most_common())

    def lines(self, top: int = 25) -> list[str]:
        if not self.ms_per_step:
            return ['kernels     none on a device in the trace (a CPU backend runs no device kernels)']
        cats = ', '.join(f'{name} {ms:.2f}' for name, ms in self.by_category().items())
        out = [f'kernels     {self.total_ms:.2f} ms per step on the device: {cats} (ms)']
        ranked = sorted(self.ms_per_step.items(), key=lambda item: -item[1])[:top]
        for name, ms in ranked:
            out.append(f'  {ms:8.3f} ms {self.calls_per_step[name]:6.1f}x  {name[:110]}')
        return out


def category(kernel_name: str) -> str:
    lowered = kernel_name.lower()
    for name, fragments in CATEGORIES:
        if any(f in lowered for f in fragments):
            return name
    return 'other'


def summarize_trace(trace: dict, steps: int) -> KernelSummary:
    """Sums the device rows of a Perfetto trace ({'traceEvents': [...]}) per kernel name."""
    events = trace['traceEvents']
    device_pids = {
        e['pid']
        for e in events
        if e.get('ph') == 'M' and e.get('name') == 'process_name' and '/device:' in e['args']['name']
    }
    time_us, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.get('ph') == 'X' and e.get('pid') in device_pids:
            time_us[e['name']] += e['dur']
            calls[e['name']] += 1
    return KernelSummary(
        {name: us / 1e3 / steps for name, us in time_us.items()},
        {name: n / steps for name, n in calls.items()},
    )


def read_trace(path: Path, steps: int) -> KernelSummary:
    """The summary of one perfetto_trace.json.gz that jax.profiler wrote."""
    with gzip.open(path) as f:
        return summarize_trace(json.load(f), steps)


def profile(run_steps, steps: int) -> KernelSummary:
    """Traces `run_steps(steps)` (which must block until its steps are done)."""
    with tempfile.TemporaryDirectory(prefix='jaxtrain-trace-') as root:
        jax.profiler.start_trace(root, create_perfetto_trace=True)
        try:
            run_steps(steps)
        finally:
            jax.profiler.stop_trace()
        (path,) = Path(root).glob(TRACE_GLOB)
        return read_trace(path, steps)
