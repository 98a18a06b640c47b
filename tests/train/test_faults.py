"""Faults: kill -9 at twenty moments, a disk that fills during a save, a loss that stops
being finite. Nothing committed is lost, `latest` never picks an unfinished save, resumed
losses equal the uninterrupted run's bit for bit, and every stop says why in one line.

SIGTERM and SIGINT have their own test (test_seed_experiment.py). A kill series is one
sequence of real trainer processes (start, kill, resume latest, kill again, ...); each is
started while the one before trains, with its imports done, and released once that one is
dead, so the sequence costs about 3 s a kill instead of 6; the run that finishes it and the
uninterrupted run it is compared with are killed by nothing and run in the test's process.
The default run kills at five of the twenty moments, a quarter chosen by rotation
(KILL_ROTATION_ENV); the `heavy` test kills at all twenty.
"""

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from cli_runs import REPO, run_cli
from jaxtrain.checkpoint import layout as ckpt_layout
from jaxtrain.checkpoint import resume as ckpt_resume
from jaxtrain.tools import ckpt as ckpt_tool
from process_env import one_device_env
from trainer_runs import random_shard, tiny_llmc_model

_PREWARMED = """
import os, sys, time
import jax, optax, orbax.checkpoint, flax.nnx  # the slow part of a start, done while waiting

from jaxtrain import main
from jaxtrain.train import loop as train
go, deadline = sys.argv.pop(1), time.monotonic() + 600
open(go + '.ready', 'w').close()  # imports done (Trainer.wait_ready)
while not os.path.exists(go):
    if time.monotonic() > deadline:  # the test that started this one is gone
        sys.exit(3)
    time.sleep(0.005)
main.entry_point()
"""


def trainer_command(*args) -> list[str]:
    return [sys.executable, '-m', 'jaxtrain.main', f'--config={REPO / "configs/gpt2.py"}', *map(str, args)]


class Trainer:
    """`python -m jaxtrain.main ARGS` as a real process, output in a temporary file (a pipe
    nobody reads would stall it). With `release_file` it imports everything, then waits
    for release() (which creates that file) before it parses its command line."""

    def __init__(self, *args, release_file: Path | None = None):
        command = trainer_command(*args)
        if release_file:  # python -c PREWARMED FILE ARGS instead of python -m jaxtrain.main ARGS
            command = [sys.executable, '-c', _PREWARMED, str(release_file), *command[3:]]
        self.release_file = release_file
        self.log = tempfile.TemporaryFile('w+')  # noqa: SIM115  read by output(), closed by stop()
        env = one_device_env()  # one CPU device, as a user would run it
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, text=True
        )
        self.released_at = None if release_file else time.monotonic()

    def wait_ready(self, timeout=300):
        """Until a prewarmed process has done its imports and waits for release()."""
        ready, deadline = Path(f'{self.release_file}.ready'), time.monotonic() + timeout
        while not ready.exists():
            assert self.process.poll() is None and time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.005)

    def release(self):
        self.release_file.touch()
        self.released_at = time.monotonic()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill(self):
        self.process.kill()  # SIGKILL: no handler, no cleanup, no flush
        self.process.wait()

    def wait(self, timeout=300) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self):
        if self.process.poll() is None:
            self.kill()
        self.log.close()


@pytest.fixture
def trainers():
    """Starts Trainers; whatever a failing test leaves running is killed at its end."""
    started = []

    def start(*args, **kwargs) -> Trainer:
        started.append(Trainer(*args, **kwargs))
        return started[-1]

    yield start
    for trainer in started:
        trainer.stop()


def logged_losses(metrics: Path) -> list[tuple[int, float]]:
    """Every (step, loss) row of metrics.jsonl, repeats included. A kill can cut a row
    short, and the next run's first row then follows it on the same line: that row is
    read from where it starts (run_log.py begins every row with its time)."""
    rows = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                try:
                    row = json.loads(line[max(line.rfind('{"time"'), 0) :])
                except json.JSONDecodeError:
                    continue
            if 'loss' in row:
                rows.append((row['step'], row['loss']))
    return rows


def unfinished(root: Path) -> list[str]:
    """Steps under Orbax's temporary name: being written, or were when their process died."""
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if '.orbax-checkpoint-tmp' in p.name)


# --- kill -9 --------------------------------------------------------------------------------

# (what the kill waits for, then seconds more). started: this process was released (it is
# parsing, restoring, compiling); stepped: it logged its first step, whose save is starting;
# writing: a step directory under Orbax's temporary name appeared; committed: a step newer
# than the one resumed became committed (keep 3 then also rotates the oldest away).
MOMENTS = [
    ('started', 1.0),  # the first run, before anything is saved (restoring nothing, tracing)
    ('stepped', 0.0),  # still before the first save completes
    ('writing', 0.0),
    ('committed', 0.0),
    ('writing', 0.05),
    ('committed', 0.02),
    ('started', 2.0),  # compiling or running its first step
    ('writing', 0.1),
    ('stepped', 0.01),
    ('committed', 0.0),
    ('writing', 0.02),
    ('committed', 0.1),
    ('started', 0.3),  # parsing, building the model, restoring
    ('writing', 0.15),
    ('stepped', 0.03),
    ('committed', 0.05),
    ('writing', 0.2),
    ('committed', 0.0),
    ('writing', 0.01),
    ('committed', 0.2),
]
FINAL_STEP = 40
KILL_ROTATION_ENV = 'JAXTRAIN_KILL_ROTATION'
ROTATIONS = 4


def moments_of_rotation(rotation: int) -> list[tuple[str, float]]:
    """A quarter of MOMENTS, in their order: each kind of moment is dealt round the four
    quarters in turn, so every quarter has a write and a commit to land in, and the four
    rotations together kill at all twenty."""
    quarters = [[] for _ in range(ROTATIONS)]
    dealt = 0
    for kind in ('writing', 'committed', 'started', 'stepped'):
        for index, moment in enumerate(MOMENTS):
            if moment[0] == kind:
                quarters[dealt % ROTATIONS].append(index)
                dealt += 1
    return [MOMENTS[index] for index in sorted(quarters[rotation % ROTATIONS])]


def todays_rotation() -> int:
    """$JAXTRAIN_KILL_ROTATION, or the day's number: runs on four days in a row kill at every
    moment between them, and a failure names its rotation to rerun it."""
    return int(os.environ.get(KILL_ROTATION_ENV, int(time.time() // 86400)))


def _wait_for(moment, run: Trainer, root: Path, metrics: Path, rows_before: int, resumed: int, timeout=120):
    """Polls until `moment` happened for this run; False if the run ended first."""
    event, extra = moment
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            return False
        if event == 'started':
            if time.monotonic() - run.released_at >= extra:
                return True
            happened = False
        elif event == 'stepped':
            happened = len(logged_losses(metrics)) > rows_before
        elif event == 'writing':
            happened = len(logged_losses(metrics)) > rows_before and bool(unfinished(root))
        else:
            happened = any(step > resumed for step in ckpt_layout.committed_steps(root))
        if happened:
            time.sleep(extra)
            return True
        time.sleep(0.002)
    raise AssertionError(f'{moment} did not happen within {timeout} s:\n{run.output()[-3000:]}')


def _restored_step(output: str, root: Path) -> int | None:
    """The step a run restored, checking that it named a committed step directory of root."""
    match = re.search(r'resume: restored step (\d+) from (\S+)', output)
    if match is None:
        return None
    step, path = int(match.group(1)), Path(match.group(2))
    assert path == root / ckpt_layout.step_dir_name(step), f'resumed from {path}, not a final step directory'
    return step


@pytest.mark.slow
def test_kill_9_at_five_moments_then_resume_is_exact(tmp_path, trainers):
    rotation = todays_rotation()
    kill_and_resume_at(moments_of_rotation(rotation), tmp_path, trainers, f'{KILL_ROTATION_ENV}={rotation}')


@pytest.mark.heavy
def test_kill_9_at_twenty_moments_then_resume_is_exact(tmp_path, trainers):
    kill_and_resume_at(MOMENTS, tmp_path, trainers, 'all twenty moments')


def kill_and_resume_at(moments, tmp_path, trainers, which: str):
    """Kills a sequence of runs, one at each of `moments`, then lets one finish; every loss
    any of them logged is the uninterrupted run's. `which` names the moments in failures."""
    print(f'kills at: {which}')  # pytest shows it with a failure
    shard = random_shard(tmp_path / 'train.bin')
    model = tiny_llmc_model(tmp_path / 'model.bin')
    root, metrics = tmp_path / 'ck', tmp_path / 'metrics' / 'metrics.jsonl'
    common = ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]
    # The uninterrupted run is not about kills: in this process, on one device as the trainer
    # processes have (their losses match it to the bit, test_seed_experiment.py's SIGTERM test).
    reference = run_cli(*common, '--num_iteration', FINAL_STEP, '--metrics_dir', tmp_path / 'reference')
    assert reference.code == 0, reference.err[-3000:]
    resuming = ['--checkpoint_dir', root, '--resume_from', 'latest', '--metrics_dir', metrics.parent]
    sequence = [*common, *resuming, '--save_steps', 1, '--max_checkpoint_keep', 3]

    kills = []  # (moment, committed steps, unfinished directories, seconds since release) at each kill
    run = trainers(*sequence, '--num_iteration', FINAL_STEP, release_file=tmp_path / 'go-1')
    for number, moment in enumerate(moments, 1):
        committed = ckpt_layout.committed_steps(root)
        resumed = committed[-1] if committed else None
        rows_before = len(logged_losses(metrics))
        run.release()
        following = None
        if number < len(moments):
            following = trainers(
                *sequence, '--num_iteration', FINAL_STEP, release_file=tmp_path / f'go-{number + 1}'
            )
        if _wait_for(moment, run, root, metrics, rows_before, resumed or 0):
            run.kill()
            seconds = round(time.monotonic() - run.released_at, 2)
            kills.append((moment, ckpt_layout.committed_steps(root), unfinished(root), seconds))
        else:
            assert run.wait() == 0, run.output()[-3000:]
        output = run.output()
        # `latest` must pick the newest step committed before this run started (checked
        # whenever the run got as far as restoring).
        restored = _restored_step(output, root)
        if restored is not None or len(logged_losses(metrics)) > rows_before:
            assert restored == resumed, output[-3000:]
            if resumed is None:
                assert 'no committed checkpoint' in output and 'starting fresh' in output, output[-3000:]
        run = following

    # The last run is left alone: it resumes the newest commit and trains to the end. It is
    # killed by nothing, so it runs in this process; fewer saves make it quicker, and save_steps
    # may change.
    committed = ckpt_layout.committed_steps(root)
    assert committed and committed[-1] < FINAL_STEP, committed
    final = run_cli(*sequence, '--num_iteration', FINAL_STEP, '--save_steps', 8)
    assert final.code == 0, final.out[-3000:] + final.err[-3000:]
    assert _restored_step(final.out, root) == committed[-1], final.out[-3000:]

    expected = dict(logged_losses(tmp_path / 'reference' / 'metrics.jsonl'))
    assert sorted(expected) == list(range(1, FINAL_STEP + 1))
    rows = logged_losses(metrics)
    # Every loss any run logged, killed or not, repeated after a resume or not, is the
    # uninterrupted run's, bit for bit; the last run logged every step after its resume.
    wrong = [(step, loss, expected[step]) for step, loss in rows if loss != expected[step]]
    assert not wrong, wrong[:5]
    assert [step for step, _ in rows[-(FINAL_STEP - committed[-1]) :]] == list(
        range(committed[-1] + 1, FINAL_STEP + 1)
    )
    assert ckpt_layout.committed_steps(root)[-1] == FINAL_STEP and unfinished(root) == []
    # The kills did land in the middle of writes, not only between them.
    assert len(kills) == len(moments) and any(leftover for _, _, leftover, _ in kills), kills


def test_the_four_rotations_kill_at_every_moment_once_each_with_a_write_and_a_commit():
    rotations = [moments_of_rotation(r) for r in range(ROTATIONS)]
    assert sorted(m for moments in rotations for m in moments) == sorted(MOMENTS)
    for moments in rotations:
        assert len(moments) == 5
        assert {'writing', 'committed'} <= {event for event, _ in moments}, moments
    assert moments_of_rotation(ROTATIONS + 1) == rotations[1]


# --- a full disk ----------------------------------------------------------------------------

DISK_FULL_RUN = ['--num_iteration', 10, '--save_steps', 1, '--max_checkpoint_keep', 2]


# A shell in its own user and mount namespace: root there, so it may mount a tmpfs that
# no other process sees and that disappears with it.
_IN_PRIVATE_MOUNTS = ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c']


def _small_filesystem_works(probe: Path) -> bool:
    """A tmpfs mounted in a private user and mount namespace (needs no privileges where the
    kernel allows unprivileged user namespaces)."""
    if not shutil.which('unshare'):
        return False
    probe.mkdir()
    try:
        done = subprocess.run(
            [*_IN_PRIVATE_MOUNTS, f'mount -t tmpfs -o size=64k tmpfs {probe} && touch {probe}/x'],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0
    finally:
        probe.rmdir()


def _run_on_small_filesystem(work: Path, common: list) -> tuple[int, str, str, Path]:
    """The trainer with its checkpoint_dir on a 1.8 MB tmpfs (two checkpoints fit, the third
    does not); the tmpfs lives as long as the namespace, so its contents are copied out."""
    mount, copy = work / 'mnt', work / 'ck'
    mount.mkdir()
    copy.mkdir()
    command = shlex.join(trainer_command(*common, *DISK_FULL_RUN, '--checkpoint_dir', mount))
    script = (
        f'mount -t tmpfs -o size=1800k tmpfs {mount} || exit 99\n'
        f'{command} > {work}/out.log 2> {work}/err.log\n'
        f'echo $? > {work}/rc\n'
        f'cp -a {mount}/. {copy}/\n'
    )
    subprocess.run([*_IN_PRIVATE_MOUNTS, script], env=one_device_env(), timeout=300, check=True)
    code = int((work / 'rc').read_text())
    return code, (work / 'out.log').read_text(), (work / 'err.log').read_text(), copy


def _run_with_failing_writes(work: Path, common: list) -> tuple[int, str, str, Path]:
    """Where no filesystem can be mounted: once two checkpoints are committed, the running
    trainer's file size limit drops to 50 kB (Python ignores SIGXFSZ, so writes past it fail
    with EFBIG), which the next save's larger files cannot fit."""
    root = work / 'ck'
    command = trainer_command(*common, *DISK_FULL_RUN, '--checkpoint_dir', root, '--num_iteration', 100_000)
    with open(work / 'out.log', 'w') as out, open(work / 'err.log', 'w') as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=one_device_env())
        try:
            deadline = time.monotonic() + 120
            while len(ckpt_layout.committed_steps(root)) < 2 and time.monotonic() < deadline:
                assert process.poll() is None, 'the trainer ended before its second save'
                time.sleep(0.002)
            resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (50_000, 50_000))
            code = process.wait(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
    return code, (work / 'out.log').read_text(), (work / 'err.log').read_text(), root


@pytest.fixture(scope='module')
def disk_full(tmp_path_factory):
    work = tmp_path_factory.mktemp('disk_full')
    shard, model = random_shard(work / 'train.bin'), tiny_llmc_model(work / 'model.bin')
    # The kill test's learning rate: its trainer processes' compiled programs serve this one.
    common = ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]
    if _small_filesystem_works(work / 'probe'):
        return ('No space left on device', *_run_on_small_filesystem(work, common))
    return ('File too large', *_run_with_failing_writes(work, common))


@pytest.mark.slow
def test_full_disk_stops_the_run_and_keeps_every_checkpoint(disk_full):
    reason, code, out, err, root = disk_full
    assert code != 0, out[-2000:]
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith('error: ') and reason in last_line, err[-2000:]
    steps = ckpt_layout.committed_steps(root)
    logged = [int(s) for s in re.findall(r'^step +(\d+)/', out, re.MULTILINE)]
    # Stopped at the save after the one that failed, which reports it; or, where the failed
    # write was still running then, at the save after that (its hand-off waits for the write
    # in the background), not later.
    assert steps and max(logged) <= steps[-1] + 3, (steps, logged)
    # Nothing was rotated away for the failed save: both steps that keep 2 holds are there.
    assert steps == [steps[-1] - 1, steps[-1]], steps
    for step in steps:
        assert ckpt_tool.main(['verify', str(root / ckpt_layout.step_dir_name(step))]) == 0
    assert ckpt_resume.resolve_resume('latest', str(root))[0] == root / ckpt_layout.step_dir_name(steps[-1])


@pytest.mark.slow
def test_full_disk_is_one_line_saying_what_to_do(disk_full):
    reason, _, _, err, root = disk_full
    steps = ckpt_layout.committed_steps(root)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    for fragment in (
        f'could not save {ckpt_layout.step_dir_name(steps[-1] + 1)}',
        reason,
        f'{ckpt_layout.step_dir_name(steps[-1])} and earlier are intact',
        'Free space',
        '--resume_from latest',
    ):
        assert fragment in lines[0], lines[0]


# --- a loss that is not finite -------------------------------------------------------------


@pytest.fixture(scope='module')
def tiny_files(tmp_path_factory):
    """The tiny model and shard, at test_checkpointing.py's learning rate: the same compiled
    program (a later --learning_rate wins, but costs a compile of its own)."""
    work = tmp_path_factory.mktemp('non_finite')
    shard, model = random_shard(work / 'train.bin'), tiny_llmc_model(work / 'model.bin')
    return ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]


@pytest.fixture(scope='module')
def saved_step_2(tiny_files, tmp_path_factory):
    """A 2-step run in its own directory that saved step 2 to the relative checkpoint_dir
    `ck`; a test that writes to it works on a copy."""
    work = tmp_path_factory.mktemp('step_2')
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        result = run_cli(*tiny_files, '--num_iteration', 2, '--save_steps', 2, '--checkpoint_dir', 'ck')
    assert result.code == 0, result.err
    assert ckpt_layout.committed_steps(work / 'ck') == [2]
    return work


def _step_params_finite(step_dir: Path) -> bool:
    params = ocp.StandardCheckpointer().restore(step_dir / 'params')
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_non_finite_loss_stops_naming_step_and_last_checkpoint(tiny_files, tmp_path):
    """Learning rate 1e30: step 1 is finite and saved; step 2's loss is NaN and so are the
    parameters it leaves. With keep 1 a save of step 2 would rotate step 1 away; nothing is
    saved, so step 1 stays."""
    root = tmp_path / 'ck'
    saving = ['--save_steps', 1, '--max_checkpoint_keep', 1, '--checkpoint_dir', root]
    result = run_cli(*tiny_files, '--learning_rate', 1e30, '--num_iteration', 5, *saving)
    assert result.code == 1
    assert len(result.error_lines) == 1 and 'Traceback' not in result.err, result.err
    line = result.error_lines[0]
    assert 'step 2: loss is nan' in line and 'parameters finite: False' in line, line
    assert f'{root / "checkpoint_step_000001"}' in line, line
    assert ckpt_layout.committed_steps(root) == [1] and unfinished(root) == []
    assert _step_params_finite(root / 'checkpoint_step_000001')
    assert ckpt_tool.main(['verify', str(root / 'checkpoint_step_000001')]) == 0


@pytest.mark.slow
def test_non_finite_loss_after_resume_names_the_checkpoint_resumed(tiny_files, saved_step_2, tmp_path):
    root = tmp_path / 'ck'
    shutil.copytree(saved_step_2 / 'ck', root)
    resuming = ['--checkpoint_dir', root, '--resume_from', 'latest', '--max_checkpoint_keep', 1]
    result = run_cli(
        *tiny_files, '--learning_rate', 1e30, '--num_iteration', 9, '--save_steps', 100, *resuming
    )
    assert result.code == 1 and len(result.error_lines) == 1, result.err
    line = result.error_lines[0]
    assert 'step 4: loss is nan' in line and f'{root / "checkpoint_step_000002"}' in line, line
    assert ckpt_layout.committed_steps(root) == [2]


# --- relative paths -------------------------------------------------------------------------


@pytest.mark.parametrize('resume_from', ['ck/checkpoint_step_000002', 'latest'])
def test_relative_checkpoint_paths_resume(tiny_files, saved_step_2, tmp_path, monkeypatch, resume_from):
    """The README's own seed commands use relative paths: a run saves to a relative
    checkpoint_dir (saved_step_2) and another, started where it ran, resumes from it."""
    shutil.copytree(saved_step_2 / 'ck', tmp_path / 'ck')  # each resume saves step 3 into its own copy
    monkeypatch.chdir(tmp_path)
    resuming = ['--checkpoint_dir', 'ck', '--resume_from', resume_from]
    result = run_cli(*tiny_files, '--num_iteration', 3, '--save_steps', 1, *resuming)
    assert result.code == 0, result.err
    assert 'restored step 2' in result.out
    assert ckpt_layout.committed_steps(tmp_path / 'ck') == [2, 3]


def test_relative_path_for_the_checkpoint_tool(saved_step_2, monkeypatch, capsys):
    monkeypatch.chdir(saved_step_2)
    assert ckpt_tool.main(['verify', 'ck/checkpoint_step_000002']) == 0, capsys.readouterr()
