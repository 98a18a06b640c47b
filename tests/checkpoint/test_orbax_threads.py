"""Releasing Orbax's save threads after a failed save (checkpoint/orbax_host.py): a thread
cancelled while its asyncio work runs ends without a traceback on stderr, while an unrelated
thread's error is still reported. The threads are Orbax's own _SignalingThread, running its
run_sync as a save stage does."""

import asyncio
import threading
import time

import pytest

future = pytest.importorskip('orbax.checkpoint._src.futures.future')
asyncio_utils = pytest.importorskip('orbax.checkpoint._src.asyncio_utils')

from jaxtrain.checkpoint import orbax_host  # noqa: E402


@pytest.fixture
def reported(monkeypatch):
    """What threading.excepthook is handed, with Python's default printing replaced."""
    seen = []
    monkeypatch.setattr(threading, 'excepthook', lambda args: seen.append((args.thread.name, args.exc_type)))
    return seen


def _stage_in_its_work(name: str):
    """An Orbax stage thread that is past its signals and inside run_sync, as a metadata write."""

    async def write():
        await asyncio.sleep(60)

    thread = future._SignalingThread(
        target=lambda: asyncio_utils.run_sync(write()), send_signals=[], receive_signals=[], name=name
    )
    thread.start()
    deadline = time.monotonic() + 10
    while getattr(thread, 'main_task', None) is None:
        assert time.monotonic() < deadline, 'the stage never started its work'
        time.sleep(0.01)
    return thread


def test_a_stage_cancelled_in_its_work_ends_without_a_traceback(reported):
    thread = _stage_in_its_work('write_metadata_after_commits')
    assert orbax_host.release_waiting_threads() >= 1
    threading.Thread.join(thread, timeout=10)  # its own join() raises once it is cancelled
    assert not thread.is_alive()
    assert reported == []


def test_without_the_release_the_same_cancel_is_reported(reported):
    # The behaviour the release keeps quiet: Orbax's run() lets asyncio.CancelledError out.
    thread = _stage_in_its_work('cancelled_directly')
    thread.cancel()
    threading.Thread.join(thread, timeout=10)
    assert reported == [('cancelled_directly', asyncio.CancelledError)]


def test_other_threads_errors_are_still_reported(reported):
    thread = _stage_in_its_work('released')
    orbax_host.release_waiting_threads()
    threading.Thread.join(thread, timeout=10)

    def fail():
        raise ValueError('not ours to hide')

    other = threading.Thread(target=fail, name='other')
    other.start()
    other.join()
    assert reported == [('other', ValueError)]
