"""The pinned host memory that saves copy a GPU's arrays into, and the pool it comes from.

A copy into pinned (page-locked) memory is the device's own DMA, which runs beside the train
steps; a copy into pageable memory goes through the driver's staging and held the steps. Both
savers copy that way: Orbax's (orbax_host.py, manager.py) and the InfiniTrain format's
(formats/infinitrain/saver.py). When a copy is dispatched matters too: one dispatched while steps
are queued runs after them, and a loss read queued behind it comes back a step late; the
InfiniTrain format's copies are therefore dispatched by the loop between two steps
(step_aligned_copies.py).

XLA's GPU client serves such buffers from a pool that grows on demand and keeps what it grew. The
first save of a run therefore pins all it copies at once: for GPT-2 124M with AdamW, 1.4 GB in
cuMemHostAlloc calls that took 0.4-0.7 s on an H200 while holding the CUDA driver's lock, so the
train step's launches waited behind them and the steps after the first save took 300-700 ms
instead of 31 (a profiler trace shows cuMemHostAlloc under Orbax's transfer thread, and the train
step's command-buffer update waiting). Later saves reuse the pool. Copying the state there once,
before step 1, pays that cost where nothing waits on it.

Pinning is slow (about 1.2 GB/s on that machine: 14 s for a LLaMA-3.2 1B state of 16.75 GiB), so
each saver grows the pool for what it copies at once only: Orbax's (manager.Checkpointer.prepare)
by its largest arrays (leaves_to_pin's limit), the InfiniTrain format's writer by the bytes its
copies may hold at once (grow_pinned_host_pool_by). A pool that grows during a save takes
cuMemHostAlloc calls that double in size beside the train steps: on a GPU profile of a LLaMA-3.2 1B
save, 26, 39 and 79 ms calls overlapped train steps whose command-buffer update took 69 and 86 ms
instead of about 5.
"""

from __future__ import annotations

import time

import jax


def pinned_sharding(device) -> jax.sharding.Sharding | None:
    """`device`'s pinned host memory as a sharding to device_put into; None where it has none."""
    if not any(memory.kind == 'pinned_host' for memory in device.addressable_memories()):
        return None
    return jax.sharding.SingleDeviceSharding(device, memory_kind='pinned_host')


def rows_per_piece(array, piece_bytes: int) -> int:
    """How many of `array`'s rows (along its first axis) a piece of at most piece_bytes holds, one
    at least: both savers cut large arrays so, to keep each pinned copy small."""
    return max(1, piece_bytes // (array.nbytes // array.shape[0]))


def leaves_to_pin(tree, limit_bytes: int | None = None) -> list:
    """The arrays of `tree` whose copies grow the pool: all of them without a limit; with one, the
    largest first while they fit in limit_bytes (the largest always, which a save cannot split)."""
    leaves = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]
    if limit_bytes is None:
        return leaves
    chosen, total = [], 0
    for leaf in sorted(leaves, key=lambda leaf: leaf.nbytes, reverse=True):
        if chosen and total + leaf.nbytes > limit_bytes:
            continue
        chosen.append(leaf)
        total += leaf.nbytes
    return chosen


def _pinned_for_saves(arrays) -> jax.sharding.Sharding | None:
    """The pinned host memory that saves of `arrays` copy into; None where saves would not use
    pinned memory (not a GPU, or several processes, whose arrays are sharded across hosts) or the
    arrays are not on one device."""
    if jax.default_backend() != 'gpu' or jax.process_count() != 1:
        return None
    devices = {device for array in arrays for device in array.devices()}
    if len(devices) != 1:
        return None
    return pinned_sharding(next(iter(devices)))


def _timed_copies(arrays: list, pinned) -> float:
    """Copies `arrays` into `pinned` at once, waits, drops the copies; returns the seconds."""
    began = time.perf_counter()
    # All at once, as a save copies them: the pool must hold them side by side, not one at a time.
    copies = jax.device_put(arrays, [pinned] * len(arrays))
    jax.block_until_ready(copies)
    del copies
    return time.perf_counter() - began


def grow_pinned_host_pool(tree, limit_bytes: int | None = None) -> float:
    """Copies the arrays of `tree` (on one GPU) into pinned host memory at once and drops the
    copies, so that the pool keeps room for a save of the same arrays; with limit_bytes, only as
    many as a save holds at once (leaves_to_pin). Blocks until done and returns the seconds
    taken; 0.0 where saves would not use pinned memory (_pinned_for_saves)."""
    leaves = leaves_to_pin(tree, limit_bytes)
    pinned = _pinned_for_saves(leaves)
    return 0.0 if pinned is None else _timed_copies(leaves, pinned)


def grow_pinned_host_pool_by(tree, nbytes: int) -> float:
    """Grows the pool that saves of `tree` (on one GPU) copy into by one region of `nbytes`, for
    copies that take pieces of it at a time: a buffer of zeros made on the device, copied to
    pinned memory and dropped. Blocks until done and returns the seconds taken; 0.0 where saves
    would not use pinned memory (_pinned_for_saves)."""
    pinned = _pinned_for_saves([leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)])
    if pinned is None or nbytes <= 0:
        return 0.0
    zeros = jax.numpy.zeros(nbytes, jax.numpy.uint8, device=next(iter(pinned.device_set)))
    return _timed_copies([zeros], pinned)


def pinned_line(leaves, seconds: float) -> str | None:
    """The run's start line for what grow_pinned_host_pool pinned (`leaves`, in `seconds`); None
    where it pinned nothing."""
    return pinned_bytes_line(sum(leaf.nbytes for leaf in leaves), seconds)


def pinned_bytes_line(nbytes: int, seconds: float) -> str | None:
    """The run's start line for `nbytes` pinned in `seconds`; None where nothing was pinned."""
    if seconds <= 0:
        return None
    return f'saves: pinned {nbytes / 2**30:.2f} GiB of host memory for checkpoint copies in {seconds:.2f} s'
