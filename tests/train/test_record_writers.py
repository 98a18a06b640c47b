"""No writer of the run's record can block the loop (train/run_log.py, train/dashboards.py).

A full disk is simulated where the bytes go: /dev/full (every write fails with ENOSPC) under
metrics.jsonl, and tensorboardX's record writer made to fail like it from a given step; a FIFO
is a real one. Each test runs under a deadline, so a regression fails instead of hanging.
"""

import contextlib
import errno
import os
import signal
import sys

import pytest

from jaxtrain.train.dashboards import Dashboards
from jaxtrain.train.run_log import RecordWriteError, RunLog
from trainer_runs import load_config, random_shard, tiny_llmc_model, train


@contextlib.contextmanager
def deadline(seconds: float):
    """Raises TimeoutError in the block after `seconds`, and again every second until it leaves
    the block: SIGALRM interrupts a blocked open or queue put (a thread-based timeout could not),
    and the repeats interrupt a cleanup that blocks again on its way out."""

    def expire(*_):
        raise TimeoutError(f'still blocked after {seconds} s')

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_named_metrics_jsonl_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / 'metrics.jsonl')
    with deadline(10), pytest.raises(ValueError) as refused:
        RunLog(str(tmp_path))
    line = str(refused.value)
    assert f'{tmp_path / "metrics.jsonl"}: expected a regular file' in line and 'a FIFO' in line, line
    assert '--metrics_dir' in line and '\n' not in line


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full')
def test_a_full_disk_under_metrics_jsonl_names_the_file_and_the_step(tmp_path, monkeypatch):
    log = RunLog(str(tmp_path))
    log.record({'step': 1, 'loss': 2.0})
    # From here every byte written to metrics.jsonl meets a full disk.
    monkeypatch.setattr(log, 'metrics_file', open('/dev/full', 'a'))
    with deadline(10), pytest.raises(RecordWriteError) as failed:
        log.record({'step': 2, 'loss': 1.5})
    line = str(failed.value)
    assert line.startswith(f'{tmp_path / "metrics.jsonl"}: could not write the row of step 2: ')
    assert 'No space left on device [Errno 28]' in line, line
    log.record({'step': 2, 'save_commit_s': 0.1})  # the failed file is not written again
    log.close()  # nor flushed on close
    assert (tmp_path / 'metrics.jsonl').read_text().count('\n') == 1


def test_a_wandb_log_that_raises_names_the_step_and_finishes_the_run_failed(monkeypatch):
    from test_dashboards import fake_wandb

    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, 'wandb', wandb)
    dashboards = Dashboards(load_config('gpt2', wandb_project='p'), first_step=0)
    (run,) = wandb.runs

    def refuse(values):
        raise ConnectionError('the W&B service went away')

    run.log, run.dir = refuse, '/runs/w'
    log = RunLog()
    log.dashboards = dashboards
    with pytest.raises(RecordWriteError, match=r'^W&B run /runs/w: could not write the row of step 4: the'):
        log.record({'step': 4, 'loss': 1.0})
    assert log.dashboards is None and run.exit_code == 1


@pytest.mark.slow
def test_a_full_disk_under_tensorboard_ends_the_run_in_one_line_naming_the_last_checkpoint(
    tmp_path, monkeypatch
):
    """tensorboardX's own writer thread died on the failed write and the loop then blocked
    forever on its full queue. The write fails from step 3's row on; step 2 was saved."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import RecordWriter

    from jaxtrain.train.loop import TrainingError

    write = RecordWriter.write

    def full_from_step_3(self, data):
        if Event.FromString(data).step >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(self, data)

    monkeypatch.setattr(RecordWriter, 'write', full_from_step_3)
    config = load_config(
        'gpt2',
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        learning_rate=1e-3,
        num_iteration=6,
        save_steps=2,
        checkpoint_dir=str(tmp_path / 'ck'),
        tensorboard_dir=str(tmp_path / 'tb'),
        metrics_dir=str(tmp_path / 'm'),
    )
    with deadline(120), pytest.raises(TrainingError) as stopped:
        train(config)
    line = str(stopped.value)
    (events,) = (tmp_path / 'tb').iterdir()
    assert line.startswith(f'{events}: could not write the row of step 3: No space left on device'), line
    assert 'the run stopped without saving' in line and '\n' not in line
    assert f'the newest committed checkpoint is {tmp_path / "ck" / "checkpoint_step_000002"}' in line, line
    assert sorted(p.name for p in (tmp_path / 'ck').glob('checkpoint_step_*')) == ['checkpoint_step_000002']
