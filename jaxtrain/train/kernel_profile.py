"""Where a step's device time goes: a jax.profiler trace, summed per kernel.

`python -m jaxtrain.bench ... --profile_steps 3` traces that many steps after the timed
phase and prints the summary (bench/figures.py's `profile` figure). The trace is
the Perfetto JSON that jax.profiler writes beside its xplane file; device kernels are the
events on the rows of processes named like '/device:GPU:0'.
"""

import collections
import dataclasses
import gzip
import json
import tempfile
from pathlib import Path

import jax

# Where jax.profiler.start_trace(root, create_perfetto_trace=True) puts the Perfetto JSON.
TRACE_GLOB = 'plugins/profile/*/perfetto_trace.json.gz'

# Kernel-name fragments, lower case, tried in this order.
CATEGORIES = (
    ('loss', ('softmax_cross_entropy',)),  # models/cross_entropy_kernel.py's Pallas kernel
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
