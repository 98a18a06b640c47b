"""A stop by SIGTERM / SIGINT takes effect at the end of a step, and the device runs a step ahead
of the lines printed, so the run may stop one or two steps after the last step shown when the
signal came. The closing line says so; it used to name only the step it stopped after."""

import signal
from types import SimpleNamespace

from jaxtrain.train.loop import _exit
from jaxtrain.train.loop import StopRequest


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, line):
        self.lines.append(line)


def _saver(saved_step):
    checkpointer = SimpleNamespace(step_dir=lambda s: f'ck/checkpoint_step_{s:06d}')
    return SimpleNamespace(last_saved_step=saved_step, checkpointer=checkpointer)


def _stopped(last_shown, stopped_after):
    stop = StopRequest()
    stop.last_shown_step = last_shown
    stop._handle(signal.SIGTERM, None)  # what the signal does: no second one, so no abort
    log = _Log()
    assert _exit(log, stop, True, _saver(stopped_after), stopped_after) == 0
    return log.lines[-1]


def test_a_stop_after_later_steps_names_the_step_shown_when_the_signal_came():
    line = _stopped(3, 5)
    assert line.startswith('SIGTERM (arrived after step 3 was printed; the steps already running on the')
    assert line.endswith('stopped after step 5; resume with --resume_from ck/checkpoint_step_000005')
    assert 'the step already running' in _stopped(4, 5)


def test_a_stop_right_after_the_step_shown_is_one_plain_line():
    expected = 'SIGTERM: stopped after step 5; resume with --resume_from ck/checkpoint_step_000005'
    assert _stopped(5, 5) == expected
