"""What a run prints: InfiniTrain's step line (so its compare_loss.py reads our logs), a
start-up summary, and optionally a JSONL metrics file. Only process 0 writes."""

import json
import sys
import time
from pathlib import Path

import jax


def peak_memory_mb() -> int | None:
    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get('peak_bytes_in_use')
    return None if peak is None else int(peak // 2**20)


class RunLog:
    def __init__(self, log_dir: str = ''):
        self.is_main = jax.process_index() == 0
        self.metrics_file = None
        if log_dir and self.is_main:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.metrics_file = open(Path(log_dir) / 'metrics.jsonl', 'a')

    def info(self, message: str):
        if self.is_main:
            print(message, flush=True)

    def warn(self, message: str):
        if self.is_main:
            print(f'warning: {message}', file=sys.stderr, flush=True)

    def step(
        self,
        step: int,
        num_steps: int,
        loss: float,
        lr: float,
        seconds: float,
        tokens: int,
        data_parallel: int,
        extra: dict | None = None,
    ):
        """`step   41/100 | train loss 3.123456 | lr 1.00e-04 | (12.34 ms | 20745 tok/s | ...)`."""
        peak = peak_memory_mb()
        tail = f'{seconds * 1e3:.2f} ms | {tokens / seconds:.0f} tok/s'
        if peak is not None:
            tail += f' | peak used: {peak:5d} MB'
        tail += f', DP={data_parallel}'
        self.info(f'step {step:4d}/{num_steps} | train loss {loss:.6f} | lr {lr:.2e} | ({tail})')
        self.record(
            {
                'step': step,
                'loss': loss,
                'lr': lr,
                'step_ms': seconds * 1e3,
                'tokens_per_s': tokens / seconds,
                'peak_mb': peak,
                **(extra or {}),
            }
        )

    def record(self, row: dict):
        if self.metrics_file:
            self.metrics_file.write(json.dumps({'time': time.time(), **row}) + '\n')
            self.metrics_file.flush()

    def close(self):
        if self.metrics_file:
            self.metrics_file.close()
