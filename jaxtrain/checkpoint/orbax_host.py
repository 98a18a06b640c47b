"""What Orbax's async saves (manager.py) need from the process around them: the order in which
they copy arrays off the device; and their background threads, let go after a save failed so that
the run can exit.

The pinned host pool (pinned_host.py). On a GPU Orbax copies every array off the device into
pinned host memory; it transfers at most manager.HOST_TRANSFER_GB at a time, and the pool grows
for that much only: the largest arrays that fit in it.

The batches. save_device_host_concurrent_gb is meant to copy a save off the device a batch at a time,
each batch written before the next is copied, so that host memory holds one batch, not the state.
In orbax-checkpoint 0.12.4 (_src/serialization/jax_array_handlers.py, _serialize_arrays) the array
handler asks its status callback for each array's transfer priority and batches only the arrays
answered ASYNCHRONOUS_DEPRIORITIZED; its default callback answers SYNCHRONOUS for every array, and
the handler's is_prioritized_key_fn is stored but never asked. So every array was copied at once,
before save() returned: for a LLaMA-3.2 1B state (16.75 GiB) on one H100 that took 11.5 s on the
hand-off thread, the pinned pool grew to 32 GiB during the first save and kept it, and the commit
came 17.0 s after the save began. In 2 GB batches the hand-off takes 0.01 s, the pool stays at 8 GiB
and the commit comes after 9.7 s (bench/orbax_memory.py: the checkpointer alone, no training beside it).
TransferOrder answers instead; it batches only a save of a private snapshot, since the batches are
copied after save() has returned and the live state is donated by the next step.

The pieces. Orbax copies each array (a shard of it, on several devices) off the device with one
`jax.device_put` to pinned host memory. On one H100 at LLaMA-3.2 1B, where the stacked layers
make arrays of 1.07 GB, the thread making that call held the GIL for about 620 ms during the first
save, so the loop's thread could not launch the next step, which took 2.3-5x the median
(bench/orbax_save_levers.py samples every thread from the save's start). The InfiniTrain-format
writer, which copies a layer at a time, did not stall the loop that way. copy_in_pieces makes
Orbax's copies go a piece at a time too: each array of a batch is cut on the device along its first
axis into pieces of at most piece_bytes (a row at least), all at once (the device cuts them after
the step it is running); PIECES_IN_FLIGHT pieces at a time are copied to pinned memory, each with
a device_put of its own, and joined into its array in pageable memory on a thread of their own,
which is what Orbax writes. A pinned piece is let go once joined, so the pinned pool holds a few
pieces, never the arrays that tensorstore still holds while it writes them. The pieces of a batch
are a second copy of it on the device, so only batches are copied this way: a save of the live
state, copied whole before save() returns, is copied as Orbax copies it. The cost is the join: the
commit of a 1B step took 12.61 s against 10.45 (manager.HOST_PIECE_MB has the figures), which
copying ahead (below) more than wins back.

Copying ahead. Orbax copies a batch, writes it, and only then copies the next, so a commit takes
the sum of every batch's copy and write. Its batcher (worker_memory_utils.next_memory_budgeted_batch,
which the array handler looks up at each save) is wrapped to tell which batch follows the one it
yields; when Orbax asks for a batch's copy, the next batch's copy starts on a thread of its own and
runs while this one is written, and Orbax's next request takes it. A copy made ahead is used only
for exactly the arrays it was made of; anything else is copied when asked. BATCHES_AHEAD = 0 turns
it off. On one H100 at LLaMA-3.2 1B, the commit took 11.92 s (0.93x the disk's direct-I/O write)
against 14.56 s without it, in one call.

The threads. In orbax-checkpoint 0.12.4 (orbax/checkpoint/_src/futures/future.py) each stage of an
async save runs in a `_SignalingThread` that first waits for the signals of the stages before it
(e.g. "the step directory exists"), and sets its own signals only when its work succeeds or is
cancelled. When a stage fails (a filesystem that turned read-only refuses the step directory), its
signal is never set: the threads waiting for it block in the signaling client until
AsyncOptions.timeout_secs (1200 s), and since they are not daemon threads the interpreter waits for
them at exit. The run had already reported the failure and then seemed to hang.

Once the save has failed nothing of it can be committed any more, so each waiting thread is
cancelled and the signals it waits for are set: it wakes, sees itself cancelled, and returns
without doing its work.

A thread already past its wait (writing the metadata, say) is cancelled through its asyncio task
instead, and its run() lets asyncio.CancelledError escape: that is a BaseException, and run()
catches only Exception. Python would print its traceback after the run's one-line error, so the
threads released here end quietly when that is all they raise; anything else still prints.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import warnings
import weakref

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization import replica_slices, worker_memory_utils
from orbax.checkpoint._src.serialization.type_handler_registry import GLOBAL_TYPE_HANDLER_REGISTRY
from orbax.checkpoint._src.serialization.types import TransferPriority

from jaxtrain.checkpoint.pinned_host import leaves_to_pin, pinned_sharding, rows_per_piece


class TransferOrder:
    """The status callback of Orbax's array handler (see "The batches" above): in batches after
    save() returns while `in_batches` is set, all at once before it returns otherwise."""

    def __init__(self):
        self.in_batches = False

    def key_priority(self, keypath) -> TransferPriority:
        return (
            TransferPriority.ASYNCHRONOUS_DEPRIORITIZED if self.in_batches else TransferPriority.SYNCHRONOUS
        )

    def on_transfer_start(self, keypath) -> None:
        pass

    def on_transfer_end(self, keypath) -> None:
        pass

    def on_write_start(self, keypath) -> None:
        pass

    def on_write_end(self, keypath) -> None:
        pass


def row_pieces(data: jax.Array, piece_bytes: int) -> list:
    """`data` (on one device) cut along its first axis into pieces of at most piece_bytes, a row
    at least, sliced on the device; [data] where it fits."""
    if data.ndim == 0 or data.nbytes <= piece_bytes:
        return [data]
    rows = rows_per_piece(data, piece_bytes)
    return [
        jax.lax.slice_in_dim(data, at, min(at + rows, data.shape[0])) for at in range(0, data.shape[0], rows)
    ]


def _copy_piece(host: np.ndarray, at: int, pinned: jax.Array) -> None:
    """A pinned piece into host[at:] as bytes: NumPy lets go of the GIL while it copies plain
    bytes (not while it copies bfloat16), so that several pieces are copied side by side."""
    part = np.asarray(pinned).reshape(-1).view(np.uint8)
    host[at : at + part.size] = part


_orbax_copy = replica_slices.transfer_arrays_to_host  # Orbax's own, as imported
_orbax_batches = worker_memory_utils.next_memory_budgeted_batch
_piece_bytes = 0  # copy_in_pieces's settings
_batch_bytes = 0
PIECES_IN_FLIGHT = 4  # pinned pieces copied or being joined at a time: the pool they need
BATCHES_AHEAD = 1  # 0: each batch copied only when Orbax asks for it
_joiners = concurrent.futures.ThreadPoolExecutor(PIECES_IN_FLIGHT, thread_name_prefix='jaxtrain-pieces')


def _pieces_to_host(arrays, replica_args: tuple) -> list:
    """The arrays' replica slices copied to pinned memory piece by piece and joined on the host."""
    per_array = [replica_slices.get_replica_slices(array, *replica_args) for array in arrays]
    # Every piece of the batch is cut at once (the device does it after the step it is running),
    # then copied to pinned memory a few at a time, each joined into its array on a thread.
    cut = []
    for slices in per_array:
        cut.append([])
        for rslice in slices.replica_slices:
            data = rslice.data()
            cut[-1].append((rslice, data, row_pieces(data, _piece_bytes)))
    copied, in_flight = [], collections.deque()
    for slices, row in zip(per_array, cut):
        on_host = []
        for rslice, data, pieces in row:
            host, at = np.empty(data.nbytes, np.uint8), 0  # filled by the joining threads
            pinned = pinned_sharding(data.device)
            for piece in pieces:
                if len(in_flight) == PIECES_IN_FLIGHT:
                    in_flight.popleft().result()
                in_flight.append(_joiners.submit(_copy_piece, host, at, jax.device_put(piece, pinned)))
                at += piece.nbytes
            joined = host.view(data.dtype).reshape(data.shape)
            on_host.append(dataclasses.replace(rslice, unsliced_data=joined, slice_args=None))
        copied.append(dataclasses.replace(slices, is_on_host=True, replica_slices=on_host))
    for joining in in_flight:
        joining.result()
    return copied


class _CopyAhead:
    """The batch that Orbax's batcher yields next, copied on a thread of its own while the batch
    before it is written (see "Copying ahead" above). One copy runs at a time, so the pinned pool
    never holds more than PIECES_IN_FLIGHT pieces; host memory holds two batches."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = ()  # the arrays of the batch after the one yielded last
        self._copying = None  # (arrays, future of their copy)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='jaxtrain-copy-ahead')

    def yielding(self, following) -> None:
        """Orbax's batcher is about to yield a batch; `following` is the one after it, or ()."""
        with self._lock:
            self._next = tuple(following)

    def take(self, arrays):
        """The copy of `arrays` made ahead, or None where none was made of exactly these."""
        with self._lock:
            copying, self._copying = self._copying, None
        if copying is None:
            return None
        ahead, future = copying
        concurrent.futures.wait([future])  # even when it is not these arrays: one copy at a time
        if len(ahead) == len(arrays) and all(a is b for a, b in zip(ahead, arrays)):
            return future.result()
        return None

    def start(self, replica_args: tuple) -> None:
        """Copies the batch after the current one, if Orbax's batcher told it."""
        with self._lock:
            following, self._next = self._next, ()
            if BATCHES_AHEAD and following:
                self._copying = (following, self._thread.submit(_pieces_to_host, following, replica_args))

    def forget(self) -> None:
        """Drops what was told and copied (the save ended, or failed)."""
        with self._lock:
            copying, self._copying, self._next = self._copying, None, ()
        if copying is not None and not copying[1].cancel():
            concurrent.futures.wait([copying[1]])  # one copy at a time, across saves too


_ahead = _CopyAhead()


def _batches_telling_the_next(params, worker_memory_budget, *, replica_id, dispatcher):
    """worker_memory_utils.next_memory_budgeted_batch (orbax-checkpoint 0.12.4), telling _ahead
    which batch comes after each one it yields."""
    batches = list(_orbax_batches(params, worker_memory_budget, replica_id=replica_id, dispatcher=dispatcher))
    try:
        for at, batch in enumerate(batches):
            _ahead.yielding([array for array, _, _ in batches[at + 1]] if at + 1 < len(batches) else ())
            yield batch
    finally:
        _ahead.forget()


def _copy_in_pieces(
    arrays,
    replica_id,
    use_replica_parallel,
    min_slice_bytes_for_replica_parallel=None,
    max_replicas_for_replica_parallel=None,
    *,
    enable_pinned_host_transfer=False,
):
    """replica_slices.transfer_arrays_to_host's contract (orbax-checkpoint 0.12.4), piece by
    piece into pinned memory, the next batch copied ahead. Orbax's own copy into pageable memory,
    and for more than a batch at once (a save of the live state, copied whole before save()
    returns), where the pieces would hold a second copy of the state on the device."""
    replica_args = (
        replica_id,
        use_replica_parallel,
        min_slice_bytes_for_replica_parallel,
        max_replicas_for_replica_parallel,
    )
    batch = max(_batch_bytes, *(array.nbytes for array in arrays)) if arrays else 0
    if not enable_pinned_host_transfer or sum(array.nbytes for array in arrays) > batch:
        return _orbax_copy(arrays, *replica_args, enable_pinned_host_transfer=enable_pinned_host_transfer)
    copied = _ahead.take(arrays)
    if copied is None:
        copied = _pieces_to_host(arrays, replica_args)
    _ahead.start(replica_args)
    return copied


def pieces_to_pin(tree, piece_bytes: int) -> list:
    """The pieces (on the device) whose copies grow the pinned pool as far as a save in pieces of
    piece_bytes needs: PIECES_IN_FLIGHT of them, cut from the largest arrays."""
    chosen = []
    for leaf in sorted(leaves_to_pin(tree), key=lambda leaf: leaf.nbytes, reverse=True):
        chosen += row_pieces(leaf, piece_bytes)[: PIECES_IN_FLIGHT - len(chosen)]
        if len(chosen) == PIECES_IN_FLIGHT:
            break
    return chosen


def copy_in_pieces(piece_bytes: int, batch_bytes: int = 0) -> None:
    """From now on, in this process, Orbax's saves copy arrays into pinned host memory in pieces of
    at most piece_bytes (see "The pieces" above), in batches of at most batch_bytes or one array
    (its save_device_host_concurrent_gb); piece_bytes 0: as one device_put each, Orbax's own way."""
    global _piece_bytes, _batch_bytes
    _piece_bytes, _batch_bytes = piece_bytes, batch_bytes
    replica_slices.transfer_arrays_to_host = _copy_in_pieces if piece_bytes else _orbax_copy
    batcher = _batches_telling_the_next if piece_bytes else _orbax_batches
    worker_memory_utils.next_memory_budgeted_batch = batcher


def type_handlers(order: TransferOrder):
    """Orbax's standard type handlers, with a jax.Array handler that asks `order`."""
    others = (int, float, bytes, np.number, np.ndarray, str, type(ocp.PLACEHOLDER))
    arrays = ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(), callback=order)
    return ocp.type_handlers.create_type_handler_registry(
        *[(kind, GLOBAL_TYPE_HANDLER_REGISTRY.get(kind)) for kind in others], (jax.Array, arrays)
    )


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
