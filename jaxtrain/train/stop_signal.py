"""SIGTERM / SIGINT ask the loop to stop after the current step (and save). The handler
stays installed until the last save is committed (loop.py restores it only after the
saver's close), so a preemption during the final save waits for that save.

A second signal (either kind) aborts at once: one line saying what is lost, the lock of
the checkpoint root released, and os._exit, which skips the interpreter's teardown. A
plain exit would unwind while Orbax's and TensorStore's threads still write, and a C++
thread destroyed while it runs ends the process in `terminate called without an active
exception` (exit 134) instead of the exit code of the signal.
"""

import os
import signal
import sys

from jaxtrain.checkpoint.root_access import release_held


class StopRequest:
    def __init__(self, describe_loss=lambda: ''):
        """describe_loss: what an abort loses, for its line (RunSaver.abort_notice)."""
        self.signal_name = ''
        self.last_shown_step = None  # set by the loop as it prints each step
        self.arrived_after = None  # last_shown_step when the first signal came
        self._previous = {}
        self._describe_loss = describe_loss

    def __bool__(self):
        return bool(self.signal_name)

    def _handle(self, signum, frame):
        if self.signal_name:
            self._abort(signum)
        self.arrived_after = self.last_shown_step
        self.signal_name = signal.Signals(signum).name

    def _abort(self, signum):
        try:
            lost = self._describe_loss() or 'the run stopped without its last save'
        except Exception as e:  # noqa: BLE001  the abort must happen whatever the report does
            lost = f'what was lost is unknown ({type(e).__name__})'
        try:
            release_held()
            sys.stdout.flush()  # may be mid-write in the interrupted frame: then it raises
        except Exception:  # noqa: BLE001, S110  nothing may stop the abort
            pass
        # os.write, not print: the interrupted code may hold sys.stderr's buffer.
        os.write(2, f'{signal.Signals(signum).name} again: aborted at once; {lost}\n'.encode())
        os._exit(128 + signum)

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
