"""Where a save's cost to the training loop comes from (GPU; BENCHMARKS.md, round five).

  python launch/save_cost_probe.py [STEPS=100] [EVERY=20]

Runs the trainer's own jitted step (GPT-2 124M d12, bf16, batch 16 x 1024, unrolled layers, the
bench's random window) as the loop does: each step's loss is read while the next one runs. Every
EVERY-th step it does one more piece of a save than the mode before, so the difference between
two modes' ms/step is what that piece costs the loop:

  none          no save
  copy          the checkpointer's on-device snapshot (a copy and its checksums), then dropped
  device_get    + the copy brought to host memory, in a background thread
  write_thread  + the host arrays written to /dev/shm, in the same thread (plain file writes)
  write_process + the same write done by a helper process instead (the bytes handed over in
                  shared memory), so that no Python runs beside the loop in its process
  orbax         the checkpointer's whole save (manager.Checkpointer, Orbax into /dev/shm)
  pinned_program  a program that copies the state into pinned host memory (memory kind
                  'pinned_host'), dispatched where `copy` is; the thread reads it as NumPy
  pinned_in_step  the step after a save step also returns its input state (the state to save)
                  in pinned host memory, so the copy can overlap that step's compute; the
                  thread reads it as NumPy
  pinned_in_step_write  + the NumPy arrays written to /dev/shm in the thread
  async_host    the snapshot, then copy_to_host_async() on each of its arrays at once on the
                loop's thread (PJRT's own device-to-host stream, not the compute stream); the
                thread only waits for the host copies (np.asarray)
  async_host_write  + the host arrays written to /dev/shm in the thread
  pinned_direct the snapshot, then jax.device_put of its arrays into pinned host memory outside
                any program (a PJRT buffer copy, not a program on the compute stream), at once
                on the loop's thread; the thread reads them as NumPy
  pinned_direct_later  the same device_put, issued by the thread once the snapshot is done
  pinned_direct_write  pinned_direct + the NumPy arrays written to /dev/shm in the thread

Every mode runs unless PROBE_MODES names some (comma-separated, in the order given), e.g.
PROBE_MODES=none,copy,orbax python launch/save_cost_probe.py 100 20.

Prints one line per mode: mean ms/step over the steps after the first save (the first save
of a run is printed on its own), and that against `none`.
"""

import concurrent.futures
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from multiprocessing import shared_memory

import jax
import numpy as np

from kernel_timing import integer_args  # launch/, beside this script
from configs import gpt2
from jaxtrain.checkpoint import manager
from jaxtrain.tools import bench_measure

MODES = ('none', 'copy', 'device_get', 'write_thread', 'write_process', 'orbax', 'pinned_program', 'pinned_in_step',
         'pinned_in_step_write', 'async_host', 'async_host_write', 'pinned_direct', 'pinned_direct_later',
         'pinned_direct_write')
# The modes run (PROBE_MODES, comma-separated, picks others).
RUN = tuple(os.environ.get('PROBE_MODES', ','.join(MODES)).split(','))
# The subject: BENCHMARKS.md's GPT-2 geometry (a CPU smoke run sets these smaller).
VARIANT, BATCH, SEQUENCE, DTYPE = 'd12', 16, 1024, 'bfloat16'


def _write_arrays(arrays, directory):
    for i, array in enumerate(arrays):
        with open(f'{directory}/{i}.bin', 'wb') as f:
            f.write(memoryview(np.ascontiguousarray(array)).cast('B'))


def _writer_process(connection, directory):
    """The helper: for each message (shared-memory name, [(offset, nbytes)]), writes the pieces."""
    while (message := connection.recv()) is not None:
        name, pieces = message
        block = shared_memory.SharedMemory(name=name)
        for i, (offset, nbytes) in enumerate(pieces):
            with open(f'{directory}/{i}.bin', 'wb') as f:
                f.write(block.buf[offset : offset + nbytes])
        block.close()
        connection.send('done')


# snapshot()'s answer in the pinned_in_step modes: the next step copies its input out itself.
COPY_IN_NEXT_STEP = object()


def saved_items(state):
    """The parts of the state a checkpoint with the optimizer holds (the checkpointer's own)."""
    return manager._items(state.params, state.opt_state, state.rng)


def _to_pinned_host(tree):
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind='pinned_host')
    return jax.tree.map(lambda a: jax.device_put(a, host), tree)


def make_step_and_copy(train_step):
    """train_step that also returns its input state's items in pinned host memory."""

    def step_and_copy(state, inputs, targets):
        copy = _to_pinned_host(saved_items(state))
        new_state, metrics = train_step.__wrapped__(state, inputs, targets)
        return new_state, metrics, copy

    return jax.jit(step_and_copy, donate_argnums=0)


class Saver:
    """One mode's save, split like the loop's: snapshot() where the loop dispatches a save's
    copy (before it reads the step's loss), save() once the loss is read; the rest runs in
    one background thread (or, write_process, a helper process)."""

    def __init__(self, mode, directory, state):
        self.mode, self.directory = mode, directory
        self.pinned_program = jax.jit(_to_pinned_host)
        self.thread = concurrent.futures.ThreadPoolExecutor(1)
        self.pending = None
        if mode == 'orbax':
            self.checkpointer = manager.Checkpointer(directory, keep_latest=2, keep_every=0)
            self.checkpointer.prepare(state.params, state.opt_state, state.rng)
        if mode == 'write_process':
            nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(saved_items(state)))
            self.block = shared_memory.SharedMemory(create=True, size=nbytes)
            self.connection, child = multiprocessing.get_context('spawn').Pipe()
            self.process = multiprocessing.get_context('spawn').Process(
                target=_writer_process, args=(child, directory), daemon=True
            )
            self.process.start()

    def snapshot(self, state):
        if self.mode == 'none':
            return None
        if self.pending is not None:
            self.pending.result()
        if self.mode == 'orbax':
            return self.checkpointer.snapshot(state.params, state.opt_state, state.rng)
        if self.mode == 'pinned_program':
            return self.pinned_program(saved_items(state)), None
        if self.mode.startswith('pinned_in_step'):
            return COPY_IN_NEXT_STEP
        copy, sums = manager._snapshot(saved_items(state))
        if self.mode.startswith('async_host'):
            for leaf in jax.tree.leaves(copy):  # queued behind the snapshot; returns at once
                leaf.copy_to_host_async()
        if self.mode in ('pinned_direct', 'pinned_direct_write'):
            copy = _to_pinned_host(copy)  # outside jit: PJRT's copy between memory spaces
        return copy, sums

    def save(self, snapshot, step, record):
        if snapshot is None:
            return
        if self.mode == 'orbax':
            self.checkpointer.save_snapshot(step, snapshot, record)
            return
        copy, sums = snapshot
        self.pending = self.thread.submit(self._background, copy, sums)

    def _background(self, copy, sums):
        if self.mode == 'pinned_direct_later':
            np.asarray(sums)  # the snapshot is done: its copy has something to read
            copy = _to_pinned_host(copy)
        if self.mode.startswith('pinned'):
            arrays = [np.asarray(leaf) for leaf in jax.tree.leaves(copy)]
            if self.mode == 'pinned_in_step_write':
                _write_arrays(arrays, self.directory)
            return
        np.asarray(sums)
        if self.mode == 'copy':
            return
        if self.mode.startswith('async_host'):
            arrays = [np.asarray(leaf) for leaf in jax.tree.leaves(copy)]  # the copies queued in snapshot()
            if self.mode == 'async_host_write':
                _write_arrays(arrays, self.directory)
            return
        arrays = [np.asarray(leaf) for leaf in jax.device_get(jax.tree.leaves(copy))]
        if self.mode == 'write_thread':
            _write_arrays(arrays, self.directory)
        elif self.mode == 'write_process':
            pieces, offset = [], 0
            for array in arrays:
                view = np.ndarray(array.shape, array.dtype, buffer=self.block.buf, offset=offset)
                np.copyto(view, array)
                pieces.append((offset, array.nbytes))
                offset += array.nbytes
            self.connection.send((self.block.name, pieces))
            self.connection.recv()

    def close(self):
        if self.pending is not None:
            self.pending.result()
        if self.mode == 'orbax':
            self.checkpointer.close()
        if self.mode == 'write_process':
            self.connection.send(None)
            self.process.join()
            self.block.close()
            self.block.unlink()


def run(subject, step_fn, step_and_copy, state, mode, steps, every):
    directory = tempfile.mkdtemp(prefix=f'probe-{mode}-', dir='/dev/shm')
    saver = Saver(mode, directory, state)
    x, y = subject.inputs_AxBxT, subject.targets_AxBxT
    started = int(state.step)
    times, previous, last, copy_next = [], None, time.perf_counter(), False
    for i in range(1, steps + 1):
        if copy_next:  # the state saved is this step's input, copied out while it runs
            state, metrics, copy = step_and_copy(state, x, y)
            saver.pending = saver.thread.submit(saver._background, copy, None)
        else:
            state, metrics = step_fn(state, x, y)
        snapshot = saver.snapshot(state) if i % every == 0 else None
        copy_next = snapshot is COPY_IN_NEXT_STEP
        if copy_next:
            snapshot = None
        if previous is not None:
            float(previous['loss'])
            now = time.perf_counter()
            times.append(now - last)
            last = now
        if snapshot is not None:
            saver.save(snapshot, started + i, {'step': started + i})
        previous = metrics
    float(previous['loss'])
    saver.close()
    shutil.rmtree(directory, ignore_errors=True)
    # times[k] is step k+1's time (read while step k+2 ran); the first save is after step `every`.
    after_first = times[every + 2 :]
    first = sum(times[every - 1 : every + 2])
    return state, 1e3 * statistics.mean(after_first), 1e3 * first


def main(steps: int = 100, every: int = 20):
    config = gpt2.get_config(VARIANT)
    config.dtype, config.batch_size, config.sequence_length = DTYPE, BATCH, SEQUENCE
    config.total_batch_size, config.scan_layers, config.deterministic = BATCH * SEQUENCE, False, 'false'
    subject = bench_measure.build(config)
    step_fn = subject.parts.train_step.lower(subject.state, subject.inputs_AxBxT, subject.targets_AxBxT).compile()
    state, subject.state = subject.state, None
    step_and_copy = make_step_and_copy(subject.parts.train_step)
    step_and_copy = step_and_copy.lower(state, subject.inputs_AxBxT, subject.targets_AxBxT).compile()
    for _ in range(5):
        state, _ = step_fn(state, subject.inputs_AxBxT, subject.targets_AxBxT)
    baseline = None
    for mode in RUN:
        state, mean_ms, first_ms = run(subject, step_fn, step_and_copy, state, mode, steps, every)
        baseline = baseline or mean_ms
        print(
            f'{mode:14s} {mean_ms:7.3f} ms/step after the first save ({baseline / mean_ms:.3f}x none); '
            f'the first save and the two steps after it {first_ms:7.1f} ms',
            flush=True,
        )


if __name__ == '__main__':
    main(*integer_args(__doc__, 2))
