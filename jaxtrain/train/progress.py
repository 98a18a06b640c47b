"""What a run says about its progress, beside InfiniTrain's step line (which stays as it
is, so that its compare_loss.py reads our logs):

  compiling the train step (step 1's time includes it)...
  progress: step 120/300 (40%) | elapsed 0:01:02 | 2.05 steps/s | ETA 0:01:28 | grad norm 0.8412 | MFU 41.2%
  summary: 300 steps (1-300) | 76,800 tokens | wall 0:02:31 | 540 tokens/s mean | MFU 40.8% | loss final ...

The progress line comes every PROGRESS_EVERY_S seconds of a run (a short run prints
none). Rates leave out this run's first step, which includes the compilation. The gradient
norm (before clipping, as metrics.jsonl's grad_norm) is the last step's. MFU
(train/mfu.py) is the last step's in the progress line and the whole run's in the summary
(FLOPs of the timed steps over their time); it is left out where the device's peak is unknown.
"""

import time

PROGRESS_EVERY_S = 30.0


def clock_text(seconds: float) -> str:
    seconds = int(round(max(seconds, 0.0)))
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def _steps(count: int) -> str:
    return 'step' if count == 1 else 'steps'


class Progress:
    """Created just before the loop's first step (it prints the compiling line then);
    `step()` after each step's line; `summary()` once the loop is over."""

    def __init__(self, first_step: int, num_steps: int, tokens_per_step: int, report, clock=time.monotonic):
        self.first_step, self.num_steps, self.tokens_per_step = first_step, num_steps, tokens_per_step
        self.report, self.clock = report, clock
        self.began = self._last_line = clock()
        self.steps_done = 0
        self.step_seconds = []  # each step's own time (as the step line shows it)
        self.step_mfu = []  # each step's MFU, None where the peak is unknown
        self.final = None  # (step, loss)
        self.best = None  # (loss, step)
        if first_step < num_steps:
            report(f"compiling the train step (step {first_step + 1}'s time includes it)...")

    def _rate(self) -> float | None:
        """Steps per second of wall time after this run's first step (None before there is one)."""
        if self.steps_done < 2:
            return None
        return (self.steps_done - 1) / max(self.clock() - self._after_first, 1e-9)

    def step(
        self, step: int, loss: float, seconds: float, mfu: float | None = None, grad_norm: float | None = None
    ) -> None:
        self.steps_done += 1
        self.step_mfu.append(mfu)
        if self.steps_done == 1:
            self._after_first = self.clock()
        self.step_seconds.append(seconds)
        self.final = (step, loss)
        if self.best is None or loss < self.best[0]:
            self.best = (loss, step)
        now, rate = self.clock(), self._rate()
        if now - self._last_line < PROGRESS_EVERY_S or step >= self.num_steps or not rate:
            return
        self._last_line = now
        self.report(
            f'progress: step {step}/{self.num_steps} ({100 * step / self.num_steps:.0f}%) | '
            f'elapsed {clock_text(now - self.began)} | {rate:.2f} steps/s | '
            f'ETA {clock_text((self.num_steps - step) / rate)}'
            + (f' | grad norm {grad_norm:.4g}' if grad_norm is not None else '')
            + (f' | MFU {100 * mfu:.1f}%' if mfu else '')
        )

    def summary(self, checkpoints_written: list[int]) -> None:
        if self.steps_done == 0:
            return
        last = self.final[0]
        timed = self.step_seconds[1:]  # without the compiling step
        rate = (
            f'{self.tokens_per_step * len(timed) / max(sum(timed), 1e-9):,.0f} tokens/s mean'
            if timed
            else 'tokens/s n/a (one step, which compiled)'
        )
        timed_mfu = self.step_mfu[1:]
        if timed_mfu and all(timed_mfu):
            # Every step does the same FLOPs, so the run's MFU is the harmonic mean of the steps'.
            rate += f' | MFU {100 * len(timed_mfu) / sum(1 / m for m in timed_mfu):.1f}%'
        saved = (
            f"{len(checkpoints_written)} ({_steps(len(checkpoints_written))} "
            f"{', '.join(map(str, checkpoints_written))})"
            if checkpoints_written
            else '0'
        )
        self.report(
            f'summary: {self.steps_done} {_steps(self.steps_done)} ({last - self.steps_done + 1}-{last}) | '
            f'{self.steps_done * self.tokens_per_step:,} tokens | wall '
            f'{clock_text(self.clock() - self.began)} | '
            f'{rate} | loss final {self.final[1]:.6f}, '
            f'best {self.best[0]:.6f} at step {self.best[1]} | checkpoints written: {saved}'
        )
