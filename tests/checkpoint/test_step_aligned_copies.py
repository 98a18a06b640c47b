"""A background write's copies off the device are dispatched by the loop between two steps
(checkpoint/step_aligned_copies.py): in the writer's order, a file's turn after another's, no more
bytes held than the bound, and a fetch copies for itself when the loop is not stepping. The
copies here are jax's own, to the CPU device's pinned host memory, recorded as they are asked
for; the values fetched are held against the arrays."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.checkpoint.pinned_host import pinned_sharding
from jaxtrain.checkpoint.step_aligned_copies import StepAlignedCopies
from trainer_runs import load_config, random_shard, tiny_llmc_model, train

KIB = 1024


def _arrays(count: int, start: int = 0) -> list:
    """Distinct 1 KiB float32 arrays on the device."""
    return [jnp.full((256,), float(start + i), jnp.float32) for i in range(count)]


class _Recorded:
    """jax.device_put to pinned host memory, recording which buffers each call copied."""

    def __init__(self):
        self.calls = []
        self.pinned = pinned_sharding(jax.devices()[0]) or jax.devices()[0]

    def __call__(self, buffers):
        self.calls.append(list(buffers))
        return jax.device_put(buffers, [self.pinned] * len(buffers))


def _same(found: list, expected: list) -> bool:
    return len(found) == len(expected) and all(a is b for a, b in zip(found, expected))


def test_the_loop_dispatches_each_plan_in_turn_and_holds_no_more_than_the_bound():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=2 * KIB)
    model, moments = _arrays(4), _arrays(2, start=10)
    copies.plan(model)
    copies.plan(moments)
    copies.between_steps()
    assert _same(copy.calls[-1], [model[0], moments[0]])  # one of each file's, then the bound
    copies.between_steps()
    assert len(copy.calls) == 1  # nothing fetched: nothing more fits
    np.testing.assert_array_equal(copies.fetch(model[0]), np.asarray(model[0]))
    copies.between_steps()
    assert _same(copy.calls[-1], [model[1]])
    for array in (moments[0], model[1]):
        np.testing.assert_array_equal(copies.fetch(array), np.asarray(array))
    copies.between_steps()
    assert _same(copy.calls[-1], [model[2], moments[1]])
    assert copies.dispatched_by_loop == 5 and copies.dispatched_by_writer == 0


def test_an_array_larger_than_the_bound_is_copied_alone():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=KIB)
    large, small = jnp.ones((1024,), jnp.float32), _arrays(1)[0]  # 4 KiB, 1 KiB
    copies.plan([large, small])
    copies.between_steps()
    assert _same(copy.calls[-1], [large])
    np.testing.assert_array_equal(copies.fetch(large), np.ones(1024, np.float32))
    copies.between_steps()
    assert _same(copy.calls[-1], [small])


def test_a_fetch_waits_for_the_loop_to_dispatch_its_copy():
    copies = StepAlignedCopies(_Recorded(), in_flight_bytes=4 * KIB, wait_s=30)
    (array,) = _arrays(1, start=7)
    copies.plan([array])
    copies.loop_stepping(True)
    fetched = {}
    writer = threading.Thread(target=lambda: fetched.update(value=copies.fetch(array)))
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive(), 'the fetch waits for the loop'
    copies.between_steps()
    writer.join(10)
    assert not writer.is_alive()
    np.testing.assert_array_equal(fetched['value'], np.full(256, 7.0, np.float32))
    assert copies.dispatched_by_loop == 1 and copies.dispatched_by_writer == 0


def test_a_fetch_copies_for_itself_when_the_loop_does_not_step_in_time():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=4 * KIB, wait_s=0.3)
    first, second = _arrays(2, start=3)
    copies.plan([first, second])
    copies.loop_stepping(True)
    began = time.monotonic()
    np.testing.assert_array_equal(copies.fetch(first), np.asarray(first))
    assert 0.3 <= time.monotonic() - began < 5
    # The loop has not stepped for wait_s: until it does again, fetches do not wait.
    began = time.monotonic()
    np.testing.assert_array_equal(copies.fetch(second), np.asarray(second))
    assert time.monotonic() - began < 0.3
    assert copies.dispatched_by_writer == 2
    copies.between_steps()
    assert copy.calls == [[first], [second]]  # the loop finds nothing left to copy


def test_a_loop_that_waits_for_the_write_lets_the_writer_copy_at_once():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=4 * KIB, wait_s=30)
    (array,) = _arrays(1)
    copies.plan([array])
    copies.loop_stepping(False)
    began = time.monotonic()
    copies.fetch(array)
    assert time.monotonic() - began < 5
    assert copies.dispatched_by_writer == 1


def test_an_array_planned_twice_is_copied_and_fetched_twice():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=4 * KIB)
    tied, other = _arrays(2, start=1)
    copies.plan([tied, other, tied])  # GPT-2's model file holds wte twice (the tied head)
    copies.between_steps()
    assert _same(copy.calls[-1], [tied, other, tied])
    for array in (tied, other, tied):
        np.testing.assert_array_equal(copies.fetch(array), np.asarray(array))
    assert copies.dispatched_by_writer == 0


def test_forget_drops_what_is_planned_and_copied():
    copy = _Recorded()
    copies = StepAlignedCopies(copy, in_flight_bytes=KIB)
    arrays = _arrays(3)
    copies.plan(arrays)
    copies.between_steps()
    copies.forget()
    copies.between_steps()
    assert len(copy.calls) == 1
    copies.fetch(arrays[0])  # neither planned nor copied now: copied at once, not waited for
    assert copies.dispatched_by_writer == 1


@pytest.mark.slow
def test_the_training_loop_dispatches_an_infinitrain_writes_copies(tmp_path, monkeypatch):
    from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver

    made = []

    class Kept(StepAlignedCopies):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(infinitrain_saver, 'StepAlignedCopies', Kept)
    config = load_config(
        'gpt2',
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        checkpoint_dir=str(tmp_path / 'ck'),
        checkpoint_format='infinitrain',
        num_iteration=12,
        save_steps=4,
        sample_every=0,
    )
    code, _, out = train(config)
    assert code == 0, out
    (copies,) = made
    # The saves at steps 4 and 8 were written while the loop went on; the last one (12) after it.
    assert copies.dispatched_by_loop > 0, out


def test_a_loop_of_slow_steps_is_waited_for_two_of_its_intervals():
    copies = StepAlignedCopies(_Recorded(), in_flight_bytes=4 * KIB, wait_s=0.1)
    copies.between_steps()
    time.sleep(0.4)
    copies.between_steps()  # steps of 0.4 s: a fetch waits up to 0.8 s for the next one
    (array,) = _arrays(1)
    copies.plan([array])
    fetched = {}
    writer = threading.Thread(target=lambda: fetched.update(value=copies.fetch(array)))
    writer.start()
    time.sleep(0.3)  # past wait_s, within two intervals
    copies.between_steps()
    writer.join(10)
    assert copies.dispatched_by_loop == 1 and copies.dispatched_by_writer == 0


def test_a_copy_the_loop_cannot_make_is_left_to_the_writer_and_its_error():
    calls = []

    def failing(buffers):
        calls.append(list(buffers))
        raise RuntimeError('pinned host memory exhausted')

    copies = StepAlignedCopies(failing, in_flight_bytes=4 * KIB, wait_s=30)
    arrays = _arrays(2)
    copies.plan(arrays)
    copies.loop_stepping(True)
    copies.between_steps()  # the loop goes on
    assert len(calls) == 1
    copies.between_steps()
    assert len(calls) == 1  # nothing left planned: the loop no longer serves this write
    began = time.monotonic()
    with pytest.raises(RuntimeError, match='exhausted'):  # the writer meets it, and its save fails
        copies.fetch(arrays[0])
    assert time.monotonic() - began < 5
