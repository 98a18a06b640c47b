"""What a run prints: InfiniTrain's step lines (its [CKPT] lines are checkpoint/ckpt_lines.py's),
so its compare_loss.py and compare_tps.py read our logs and the logs of the two programs diff
cleanly; a start-up summary, and optionally a JSONL metrics file. Only process 0 writes.

The step line is byte for byte the format of example/{gpt2,llama3}/main.cc at
InfiniTensor/InfiniTrain b24d92f:
  step {:4d}/{} | train loss {:.6f} | lr {:.2e} | ({:.2f} ms | {:.0f} tok/s | peak used: {:5d} MB |
  peak reserved: {:5d} MB, DP={}, TP={}, SP={}, PP={})
The memory fields are the first local device's allocator statistics in MiB: `peak used` its
peak bytes in use, `peak reserved` the peak of the pool the allocator took from the device
(or, without that statistic, its limit). JAX does not reset a peak, so both are peaks since
the process started, where InfiniTrain resets them every step. On CPU JAX keeps no
statistics and both print 0, as InfiniTrain's CPU build does.

`[CKPT] Save begin/done` and `[CKPT] Load done` follow checkpoint.cc at the same commit. Our
saves are asynchronous: `Save done` is printed when the arrays are handed to the background
writer (the loop goes on), and the closing `saved:` line when the last write is committed.
"""

import json
import sys
import time
from pathlib import Path

import jax

from jaxtrain.train.output_directory import create_output_directory
from llmc_io.atomic_file import write_text_atomically


def _memory_stats() -> dict:
    return jax.local_devices()[0].memory_stats() or {}


def peak_memory_mb() -> int | None:
    peak = _memory_stats().get('peak_bytes_in_use')
    return None if peak is None else int(peak // 2**20)


def peak_memory_fields() -> tuple[int, int]:
    """(peak used, peak reserved) in MiB for the step line; (0, 0) where JAX keeps none."""
    stats = _memory_stats()
    used = stats.get('peak_bytes_in_use', 0)
    reserved = next((stats[k] for k in ('peak_pool_bytes', 'pool_bytes', 'bytes_limit') if k in stats), used)
    return int(used // 2**20), int(max(reserved, used) // 2**20)


def parallel_sizes(data_parallel) -> dict:
    """{'DP', 'TP', 'SP', 'PP'} from a dict of them, or from a bare data-parallel size."""
    if isinstance(data_parallel, dict):
        return {axis: int(data_parallel.get(axis, 1)) for axis in ('DP', 'TP', 'SP', 'PP')}
    return {'DP': int(data_parallel), 'TP': 1, 'SP': 1, 'PP': 1}


def step_line(step, num_steps, loss, lr, seconds, tokens, sizes: dict, memory_mb: tuple[int, int]) -> str:
    used, reserved = memory_mb
    return (
        f'step {step:4d}/{num_steps} | train loss {loss:.6f} | lr {lr:.2e} | '
        f'({seconds * 1e3:.2f} ms | {tokens / seconds:.0f} tok/s | peak used: {used:5d} MB | '
        f"peak reserved: {reserved:5d} MB, DP={sizes['DP']}, TP={sizes['TP']}, SP={sizes['SP']}, "
        f"PP={sizes['PP']})"
    )


class RunLog:
    def __init__(self, log_dir: str = ''):
        self.is_main = jax.process_index() == 0
        self.metrics_file = None
        self.log_dir = log_dir
        self.dashboards = None  # train/dashboards.py, attached once the run knows its first step
        self.failed = False  # set when the run ends on an exception
        if log_dir and self.is_main:
            directory = create_output_directory('metrics_dir', log_dir)
            # An append log, not rewritten per row: each row goes out whole in one flushed write.
            self.metrics_file = open(directory / 'metrics.jsonl', 'a')

    def write_config(self, record: dict):
        """config.json beside metrics.jsonl: the run's resolved config (banner.run_record), this
        run's (a resume into the same directory replaces it). Written to a temporary name and
        renamed, so a reader never sees half a file. The dashboards get it as their config."""
        if self.dashboards is not None:
            self.dashboards.write_config(record)
        if not self.metrics_file:
            return
        text = json.dumps({'written_at': time.time(), **record}, indent=2, default=str) + '\n'
        write_text_atomically(Path(self.log_dir) / 'config.json', text)

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
        data_parallel,
        extra: dict | None = None,
    ):
        """InfiniTrain's step line (the module docstring). `data_parallel`: the DP/TP/SP/PP
        sizes as a dict, or the data-parallel size alone (the others 1)."""
        peak = peak_memory_mb()
        memory = peak_memory_fields()
        sizes = parallel_sizes(data_parallel)
        self.info(step_line(step, num_steps, loss, lr, seconds, tokens, sizes, memory))
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
        if self.dashboards is not None:
            self.dashboards.record(row)

    def close(self):
        """Closes the log and the dashboards; a second call does nothing (the loop closes the log
        before its summary, the caller again in case setting the run up raised)."""
        if self.metrics_file:
            self.metrics_file.close()
            self.metrics_file = None
        if self.dashboards is not None:
            self.dashboards.close(failed=self.failed)
            self.dashboards = None
