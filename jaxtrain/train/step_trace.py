"""--trace_steps FIRST-LAST: a jax.profiler trace of those steps of the real loop, summed per kernel.

The loop pipelines its steps (it dispatches step n+1 before it reads step n), so the trace waits
for the device before it starts and again before it stops: it then holds the kernels of the traced
steps and of no others, and the device time per step it reports is theirs. Those two waits, and the
profiler's own cost, are all the trace changes in the run; the host work in between (a save handed
to Orbax, a validation, a sample) is in it as the run does it.

The trace is what jax.profiler writes: an xplane file for TensorBoard's profile plugin and a
Perfetto JSON (open it at ui.perfetto.dev) in TRACE_DIR/plugins/profile/<time>/.
"""

import re
import time
from pathlib import Path

import jax

from jaxtrain.train import kernel_profile


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
        traces = sorted(self.root.glob(kernel_profile.TRACE_GLOB), key=lambda p: p.stat().st_mtime)
        if steps < 1 or not traces:
            self.info(f'trace: no step traced into {self.root}')
            return
        summary = kernel_profile.read_trace(traces[-1], steps)
        self.info(
            f'trace: steps {first}-{last_step} ({wall_s * 1e3 / steps:.2f} ms a step, traced) into '
            f'{traces[-1].parent}'
        )
        for line in summary.lines(top=8):
            self.info(f'trace: {line}')
