"""Letting go of Orbax's background threads after a save failed, so that the run can exit.

In orbax-checkpoint 0.12.4 (orbax/checkpoint/_src/futures/future.py) each stage of an async
save runs in a `_SignalingThread` that first waits for the signals of the stages before it
(e.g. "the step directory exists"), and sets its own signals only when its work succeeds or is
cancelled. When a stage fails (a filesystem that turned read-only refuses the step directory),
its signal is never set: the threads waiting for it block in the signaling client until
AsyncOptions.timeout_secs (1200 s), and since they are not daemon threads the interpreter waits
for them at exit. The run had already reported the failure and then seemed to hang.

Once the save has failed nothing of it can be committed any more, so each waiting thread is
cancelled and the signals it waits for are set: it wakes, sees itself cancelled, and returns
without doing its work.

A thread already past its wait (writing the metadata, say) is cancelled through its asyncio task
instead, and its run() lets asyncio.CancelledError escape: that is a BaseException, and run()
catches only Exception. Python would print its traceback after the run's one-line error, so the
threads released here end quietly when that is all they raise; anything else still prints.
"""

import asyncio
import concurrent.futures
import threading
import warnings
import weakref

_released: 'weakref.WeakSet[threading.Thread]' = weakref.WeakSet()
_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


def _install_quiet_cancellation() -> None:
    """Wraps threading.excepthook once, so that the threads cancelled here end quietly."""
    previous = threading.excepthook
    if getattr(previous, 'quiet_for_released', False):
        return

    def hook(args):
        if args.thread in _released and issubclass(args.exc_type, _CANCELLED):
            return
        previous(args)

    hook.quiet_for_released = True
    threading.excepthook = hook


def release_waiting_threads() -> int:
    """Cancels and wakes every live Orbax signaling thread; returns how many."""
    try:
        from orbax.checkpoint._src.futures import future
    except ImportError:  # another Orbax layout: nothing we know how to release
        return 0
    thread_class = getattr(future, '_SignalingThread', None)
    if thread_class is None:
        return 0
    # Their work, never started, is left as coroutine objects that Python would name at exit.
    warnings.filterwarnings('ignore', message='coroutine .* was never awaited', category=RuntimeWarning)
    _install_quiet_cancellation()
    released = 0
    for thread in threading.enumerate():
        if not (isinstance(thread, thread_class) and thread.is_alive()):
            continue
        _released.add(thread)
        try:
            thread.cancel()
            future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
        except AttributeError:  # a version whose threads keep these elsewhere
            continue
        released += 1
    return released
