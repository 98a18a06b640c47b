"""A background save's copies off the GPU, dispatched by the training loop between two steps.

A writer thread that copies a device buffer to pinned host memory whenever it is ready for the
next one held the train steps: on a GPU profile of a LLaMA-3.2 1B save, every device-to-host copy
dispatched while steps were queued (the writer's and the loop's reads of a step's loss alike) ran
only once the compute queued before it had drained. A step's loss read queued behind such a copy
came back only when the next step ended too: one step line about twice the median, the next near
zero, for the whole write. Copies dispatched all at once at the save, before the next step, ran
beside it and left every step line at the median; but they held the whole state in pinned memory.

So the writer says which buffers it will fetch, in its order (plan), and the loop dispatches the
next of them once an iteration (between_steps), after any read of a step's metrics, while the
step it just dispatched is the only one in flight: a copy then waits for nothing, and runs beside
that step. No more than `in_flight_bytes` are copied and not yet fetched (one entry always may
be), so the pinned pool that serves them stays that size (grown before step 1:
pinned_host.grow_pinned_host_pool_by).

Where the loop is not stepping (it waits for the write to finish, it validates, the run ended),
a fetch waits at most `wait_s`, or two of the loop's last intervals between steps where that is
longer (at most LONGEST_WAIT_S), and then copies for itself, as does a fetch of a buffer never
planned.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

# How long a fetch waits for the loop to dispatch its copy before copying for itself: steps are
# 30-300 ms at the sizes we save, so a loop that takes longer is doing something else.
WAIT_FOR_LOOP_S = 0.5
# The longest a fetch waits however slow the steps: a loop this far from its next step is not
# stepping.
LONGEST_WAIT_S = 5.0


class StepAlignedCopies:
    """Copies of device buffers that writer threads fetch and the loop thread dispatches."""

    def __init__(
        self,
        copy: Callable[[list], list],
        in_flight_bytes: int,
        wait_s: float = WAIT_FOR_LOOP_S,
    ):
        """copy(buffers) -> their copies, dispatched and not waited for (a jax.device_put to pinned
        host memory); np.asarray of a copy waits for it."""
        self._copy = copy
        self.in_flight_bytes = in_flight_bytes
        self.wait_s = wait_s
        self._lock = threading.Condition()
        self._queues = []  # deques of planned buffers not yet dispatched, one per plan() call
        # A buffer a file holds twice (a tied embedding) is planned, copied and fetched twice.
        self._copies = collections.defaultdict(list)  # id(buffer) -> its copies not yet fetched
        self._planned = collections.Counter()  # id(buffer) -> times planned, not yet dispatched
        self._held = 0  # bytes of self._copies
        self._stepping = False  # whether the loop calls between_steps
        self._last_call = None  # time.monotonic() of the last between_steps
        self._interval = 0.0  # between its last two calls
        self.dispatched_by_loop = 0  # copies between_steps dispatched (for tests and benchmarks)
        self.dispatched_by_writer = 0  # copies a fetch made for itself

    def plan(self, buffers: Iterable) -> None:
        """The buffers one writer thread will fetch, in the order it will fetch them."""
        queue = collections.deque(b for b in buffers if b is not None)
        with self._lock:
            self._planned.update(id(buffer) for buffer in queue)
            self._queues.append(queue)

    def loop_stepping(self, stepping: bool) -> None:
        """Whether the loop will call between_steps soon; while it does not, fetches copy for
        themselves at once."""
        with self._lock:
            self._stepping = stepping
            self._lock.notify_all()

    def between_steps(self) -> None:
        """Dispatches the next planned copies, a buffer from each plan in turn, while what is
        copied and not yet fetched fits in in_flight_bytes. Called by the loop once an iteration,
        with only the step it just dispatched in flight."""
        with self._lock:
            self._stepping = True
            now = time.monotonic()
            if self._last_call is not None:
                self._interval = now - self._last_call
            self._last_call = now
            chosen = []
            while True:
                progressed = False
                for queue in self._queues:
                    if not queue:
                        continue
                    nbytes = queue[0].nbytes
                    if self._held and self._held + nbytes > self.in_flight_bytes:
                        continue
                    buffer = queue.popleft()
                    self._planned[id(buffer)] -= 1
                    chosen.append(buffer)
                    self._held += nbytes
                    progressed = True
                if not progressed:
                    break
            self._queues = [queue for queue in self._queues if queue]
            if not chosen:
                return
            # The copies are dispatched under the lock, so a fetch never finds its buffer neither
            # planned nor copied.
            try:
                copies = self._copy(chosen)
            except Exception:  # noqa: BLE001  the write's, not the loop's, to report
                # The loop stops serving this write; each fetch copies for itself, meets the same
                # error, and the write fails with it (its save says so).
                self._held -= sum(buffer.nbytes for buffer in chosen)
                self._queues, self._planned = [], collections.Counter()
                self._stepping = False
                self._lock.notify_all()
                return
            for buffer, copied in zip(chosen, copies):
                self._copies[id(buffer)].append(copied)
            self.dispatched_by_loop += len(chosen)
            self._lock.notify_all()

    def fetch(self, buffer) -> np.ndarray:
        """`buffer` on the host as a NumPy array: from the copy the loop dispatched, waiting for
        it (wait_s, or two of the loop's intervals) where it is planned and the loop is stepping,
        else copied here."""
        with self._lock:
            wait = min(max(self.wait_s, 2 * self._interval), LONGEST_WAIT_S)
            deadline = time.monotonic() + wait
            while self._planned[id(buffer)] > 0 and not self._copies.get(id(buffer)) and self._stepping:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stepping = False  # until the loop's next between_steps
                    break
                self._lock.wait(left)
            found = self._copies.get(id(buffer))
            copied = found.pop(0) if found else None
            if copied is not None:
                self._held -= buffer.nbytes
                if not found:
                    del self._copies[id(buffer)]
            elif self._planned[id(buffer)] > 0:
                self._planned[id(buffer)] -= 1
                self._unqueue_first(buffer)
        if copied is None:
            copied = self._copy([buffer])[0]
            with self._lock:
                self.dispatched_by_writer += 1
        return np.array(copied)

    def _unqueue_first(self, buffer) -> None:
        """Takes the first planned occurrence of `buffer` out of its queue (by identity: == on
        arrays compares their elements)."""
        for queue in self._queues:
            for i, queued in enumerate(queue):
                if queued is buffer:
                    del queue[i]
                    return

    def forget(self) -> None:
        """Drops what is planned or copied and not fetched (a write that failed or is done)."""
        with self._lock:
            self._queues, self._held = [], 0
            self._copies, self._planned = collections.defaultdict(list), collections.Counter()
            self._lock.notify_all()
