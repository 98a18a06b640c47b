"""SIGTERM and Ctrl-C while the last save is being written, as real
processes: one run of 3 steps saving only the last, once without a signal to time
the window between the `step 3/3` line and step 3's commit, then at delays spread over
that window (and a little past it): one SIGTERM, two SIGTERMs, two SIGINTs. Every try
leaves step 3 committed, or says in one line that its save was lost; none ends in
`terminate called` (exit 134). CI makes every other try, the odd or the even ones by the kill
test's rotation (test_faults.py), so two days in a row make all ten; the `heavy` test makes all
ten at once.

The processes are prewarmed (test_faults.py's Trainer): each imports while the one
before runs, so a try costs its parse, build and three steps."""

import signal
import time

import pytest

from test_faults import KILL_ROTATION_ENV, todays_rotation, trainers  # noqa: F401  a fixture
from trainer_runs import random_shard, tiny_llmc_model

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint import root_access as ownership

TRIES = 10
STEP_LINE = 'step    3/3 |'


def _wait_for_line(run, deadline_s=300) -> float:
    deadline = time.monotonic() + deadline_s
    while STEP_LINE not in run.output():
        assert run.process.poll() is None, run.output()[-3000:]
        assert time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.002)
    return time.monotonic()


@pytest.mark.slow
def test_signals_during_the_final_save_lose_nothing_silently(tmp_path, trainers):  # noqa: F811  (a fixture)
    rotation = todays_rotation()
    tries = [i for i in range(TRIES) if i % 2 == rotation % 2]
    signal_during_the_final_save(tmp_path, trainers, tries, f'{KILL_ROTATION_ENV}={rotation}')


@pytest.mark.heavy
def test_signals_at_all_ten_delays_lose_nothing_silently(tmp_path, trainers):  # noqa: F811  (a fixture)
    signal_during_the_final_save(tmp_path, trainers, range(TRIES), 'all ten tries')


def signal_during_the_final_save(tmp_path, trainers, tries, which: str):  # noqa: F811  (the fixture's value)
    """One untimed run, then one try for each index of `tries` (of TRIES); `which` names the
    tries in failures."""
    shard, model = random_shard(tmp_path / 'train.bin'), tiny_llmc_model(tmp_path / 'model.bin')

    def command(number):
        root = tmp_path / f'ck{number}'
        args = ['--input_bin', shard, '--llmc_filepath', model, '--learning_rate', 1e-3]
        return root, [*args, '--num_iteration', 3, '--save_steps', 100, '--checkpoint_dir', root]

    # (signals, each sent this fraction of the window after the step line)
    plans = [((), 0.0)]
    kinds = [(signal.SIGTERM,), (signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT)]
    plans += [(kinds[i % 3], 1.2 * i / (TRIES - 1)) for i in tries]
    root, args = command(0)
    run = trainers(*args, release_file=tmp_path / 'go0')
    window, outcomes = None, []
    for number, (signals, fraction) in enumerate(plans):
        run.release()
        following = None
        if number + 1 < len(plans):
            next_root, next_args = command(number + 1)
            following = trainers(*next_args, release_file=tmp_path / f'go{number + 1}')
        seen = _wait_for_line(run)
        if not signals:  # the window: from the step line until step 3 is committed
            while not layout.committed_steps(root):
                assert run.process.poll() is None, run.output()[-3000:]
                time.sleep(0.002)
            window = max(time.monotonic() - seen, 0.05)
            code = run.wait()
        else:
            time.sleep(fraction * window)
            for sent, signum in enumerate(signals):
                if run.process.poll() is None:
                    run.process.send_signal(signum)
                if sent == 0:
                    time.sleep(0.02)
            code = run.wait()
        out = run.output()
        committed = layout.committed_steps(root)
        lost_line = f'{layout.step_dir_name(3)} was not committed and is lost'
        during = 'arrived during the last save' in out or 'again: aborted at once' in out
        outcomes.append((which, signals, round(fraction, 2), code, committed, lost_line in out, during))
        print(round(time.monotonic() - run.released_at, 2), window, outcomes[-1], flush=True)
        assert 'terminate called' not in out and code not in (134, -6), out[-3000:]
        if len(signals) < 2:  # one signal only waits for the save
            assert committed == [3], (outcomes, out[-3000:])
            assert code in (0, -signal.SIGTERM), (outcomes, out[-3000:])
        else:
            assert committed == [3] or lost_line in out, (outcomes, out[-3000:])
        if committed != [3]:
            assert code == 128 + signals[1], (outcomes, out[-3000:])
        if code in (0, 128 + signal.SIGINT, 128 + signal.SIGTERM):  # it ended itself: lock released
            assert not (root / ownership.LOCK_FILE).exists(), outcomes
        run, root = following, (next_root if following else root)
    # The window was hit: tries were still saving when their signals came (of the ten, eight
    # are signalled inside the window; of either five, four).
    assert sum(outcome[-1] for outcome in outcomes) >= (3 if len(plans) > TRIES else 2), outcomes
