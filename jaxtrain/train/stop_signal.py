"""SIGTERM / SIGINT ask the loop to stop after the current step (and save); a second
SIGINT interrupts at once, for a user who really means it."""

import signal


class StopRequest:
    def __init__(self):
        self.signal_name = ''
        self._previous = {}

    def __bool__(self):
        return bool(self.signal_name)

    def _handle(self, signum, frame):
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def install(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
