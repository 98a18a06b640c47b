"""What a run prints: InfiniTrain's step lines (its [CKPT] lines are checkpoint/ckpt_text.py's),
so its compare_loss.py and compare_tps.py read our logs and the logs of the two programs diff
cleanly; a start-up summary, and optionally a JSONL metrics file. Only process 0 writes.

The step line is byte for byte the format of example/{gpt2,llama3}/main.cc at
InfiniTensor/InfiniTrain b24d92f:
  step {:4d}/{} | train loss {:.6f} | lr {:.2e} | ({:.2f} ms | {:.0f} tok/s | peak used: {:5d} MB |
  peak reserved: {:5d} MB, DP={}, TP={}, SP={}, PP={})
With context parallelism (C > 1) it is the format of the context-parallel branch
(feat/context_parallel d03ba16), `..., SP={}, CP={}, PP={})`; at C = 1 it stays HEAD's.
The memory fields are the first local device's allocator statistics in MiB: `peak used` its
peak bytes in use, `peak reserved` the peak of the pool the allocator took from the device
(or, without that statistic, its limit). JAX does not reset a peak, so both are peaks since
the process started, where InfiniTrain resets them every step. On CPU JAX keeps no
statistics and both print 0, as InfiniTrain's CPU build does.

`[CKPT] Save begin/done` and `[CKPT] Load done` follow checkpoint.cc at the same commit. Our
saves are asynchronous: `Save done` is printed when the arrays are handed to the background
writer (the loop goes on), and the closing `saved:` line when the last write is committed.

Every writer of the run's record (metrics.jsonl, config.json, the dashboards) writes in the
loop's own thread, and none can block it: a write that fails raises RecordWriteError naming the
file and the step, the failed writer is closed without further writes, and the loop ends the
run on it (docs/dashboards.md says why ending, not going on without it).

Creating a directory the run writes its logs into (--metrics_dir, --tensorboard_dir): a path the
run cannot create is one line naming the key, not a bare `[Errno 2]` or `[Errno 13]`.

The config checks refuse a path that is or lies under a file before anything runs; what only the
attempt can tell (a read-only or virtual file system) is told here, when the directory is made.
"""

import errno
import json
import os
import stat
import sys
import time
from pathlib import Path
import jax

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
    """{'DP', 'TP', 'SP', 'CP', 'PP'} from a dict of them, or from a bare data-parallel size."""
    if isinstance(data_parallel, dict):
        return {axis: int(data_parallel.get(axis, 1)) for axis in ('DP', 'TP', 'SP', 'CP', 'PP')}
    return {'DP': int(data_parallel), 'TP': 1, 'SP': 1, 'CP': 1, 'PP': 1}


def step_line(step, num_steps, loss, lr, seconds, tokens, sizes: dict, memory_mb: tuple[int, int]) -> str:
    used, reserved = memory_mb
    return (
        f'step {step:4d}/{num_steps} | train loss {loss:.6f} | lr {lr:.2e} | '
        f'({seconds * 1e3:.2f} ms | {tokens / seconds:.0f} tok/s | peak used: {used:5d} MB | '
        f"peak reserved: {reserved:5d} MB, DP={sizes['DP']}, TP={sizes['TP']}, SP={sizes['SP']}, "
        + (f"CP={sizes['CP']}, " if sizes.get('CP', 1) > 1 else '')
        + f"PP={sizes['PP']})"
    )


class RecordWriteError(Exception):
    """A metrics, dashboard or sample writer could not write; the message names the file and the
    step, in one line."""


def write_failure(path, what: str, error: BaseException) -> RecordWriteError:
    """RecordWriteError for `error` (an OSError, or what a dashboard library raised) while `path`
    took `what` (`row_of(step)`, 'the run config', ...)."""
    why = (
        f'{error.strerror} [Errno {error.errno}]' if isinstance(error, OSError) and error.strerror else error
    )
    return RecordWriteError(f'{path}: could not write {what}: {why}')


def row_of(step) -> str:
    return f'the row of step {step}' if step is not None else 'a row'


def _kind_of(path: Path) -> str:
    mode = os.stat(path).st_mode
    for test, kind in (
        (stat.S_ISFIFO, 'a FIFO (named pipe)'),
        (stat.S_ISDIR, 'a directory'),
        (stat.S_ISCHR, 'a character device'),
        (stat.S_ISBLK, 'a block device'),
        (stat.S_ISSOCK, 'a socket'),
    ):
        if test(mode):
            return kind
    return 'not a regular file'


def open_append_log(path: Path):
    """`path` opened to append to, refused at once unless it is a regular file (or absent): a
    FIFO without a reader would block the open, and the run with it, with nothing printed."""
    try:
        # O_NONBLOCK: a FIFO without a reader fails with ENXIO here instead of blocking.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as error:
        if error.errno not in (errno.ENXIO, errno.EISDIR):
            raise
        fd = None
    if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd is not None:
            os.close(fd)
        raise ValueError(
            f'metrics_dir: {path}: expected a regular file to append the metrics to (or none), found '
            f'{_kind_of(path)}; remove it or pass another --metrics_dir'
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, 'a')


class RunLog:
    def __init__(self, log_dir: str = ''):
        self.is_main = jax.process_index() == 0
        self.metrics_file = self.metrics_path = None
        self.log_dir = log_dir
        self.dashboards = None  # train/dashboards.py, attached once the run knows its first step
        self.failed = False  # set when the run ends on an exception
        # What the run has saved, for the line that ends it on a failed write (set by the loop).
        self.checkpoint_notice = None
        if log_dir and self.is_main:
            directory = create_output_directory('metrics_dir', log_dir)
            # An append log, not rewritten per row: each row goes out whole in one flushed write.
            self.metrics_path = directory / 'metrics.jsonl'
            self.metrics_file = open_append_log(self.metrics_path)

    def write_config(self, record: dict):
        """config.json beside metrics.jsonl: the run's resolved config (banner.run_record), this
        run's (a resume into the same directory replaces it). Written to a temporary name and
        renamed, so a reader never sees half a file. The dashboards get it as their config."""
        if self.dashboards is not None:
            self._guarded(self.dashboards.write_config, record)
        if not self.metrics_file:
            return
        text = json.dumps({'written_at': time.time(), **record}, indent=2, default=str) + '\n'
        path = Path(self.log_dir) / 'config.json'
        try:
            write_text_atomically(path, text)
        except OSError as error:
            raise write_failure(path, 'the run config', error) from None

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
            try:
                self.metrics_file.write(json.dumps({'time': time.time(), **row}) + '\n')
                self.metrics_file.flush()
            except OSError as error:
                self.metrics_file = self._drop(self.metrics_file)
                raise write_failure(self.metrics_path, row_of(row.get('step')), error) from None
        if self.dashboards is not None:
            self._guarded(self.dashboards.record, row)

    def _guarded(self, write, value) -> None:
        """A dashboard write; a dashboard that failed is closed, as failed, and not written again."""
        try:
            write(value)
        except RecordWriteError:
            self.dashboards, dashboards = None, self.dashboards
            dashboards.close(failed=True, after_error=True)
            raise

    @staticmethod
    def _drop(file) -> None:
        """Closes `file`, ignoring a failure: after a failed write its buffer still holds the row,
        whose flush fails again."""
        try:
            file.close()
        except OSError:
            pass

    def close(self):
        """Closes the log and the dashboards; a second call does nothing (the loop closes the log
        before its summary, the caller again in case setting the run up raised)."""
        if self.metrics_file:  # every row was flushed when written: nothing is left to lose
            self.metrics_file = self._drop(self.metrics_file)
        if self.dashboards is not None:
            dashboards, self.dashboards = self.dashboards, None
            try:
                dashboards.close(failed=self.failed)
            except RecordWriteError:
                if not self.failed:  # else the error the run is ending on is the one to report
                    raise


def create_output_directory(key: str, directory: str) -> Path:
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f'{key}: {directory}: expected a directory this run can create and write in, found '
            f'{error.strerror} (while creating it); pass another --{key}'
        ) from None
    return path
