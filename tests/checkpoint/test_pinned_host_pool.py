"""grow_pinned_host_pool: skipped where saves copy into plain host memory; where it runs, the
state it copies is left as it was (the copies are dropped, the arrays stay usable)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain.checkpoint import pinned_host
from jaxtrain.checkpoint.pinned_host import grow_pinned_host_pool


def _state():
    return {
        'params': {'w': jnp.arange(12.0).reshape(3, 4), 'b': jnp.ones(4, jnp.bfloat16)},
        'rng': jnp.asarray([1, 2], jnp.uint32),
    }


def test_a_cpu_run_copies_nothing():
    assert jax.default_backend() == 'cpu'
    assert grow_pinned_host_pool(_state()) == 0.0


def test_on_a_device_with_pinned_memory_the_state_survives_the_copy(monkeypatch):
    if not any(m.kind == 'pinned_host' for m in jax.devices()[0].addressable_memories()):
        pytest.skip("this jax's CPU device has no 'pinned_host' memory to copy into")
    copied_kinds = []
    real_put = jax.device_put

    def recording_put(x, shardings):
        copied_kinds.extend(s.memory_kind for s in shardings)
        return real_put(x, shardings)

    monkeypatch.setattr(pinned_host.jax, 'default_backend', lambda: 'gpu')
    monkeypatch.setattr(pinned_host.jax, 'device_put', recording_put)
    state = _state()
    before = jax.tree.map(np.asarray, state)
    assert grow_pinned_host_pool(state) > 0.0
    assert copied_kinds == ['pinned_host'] * 3  # every array, in one call
    after = jax.tree.map(np.asarray, state)  # not donated, not deleted
    jax.tree.map(np.testing.assert_array_equal, before, after)


def test_with_a_limit_the_largest_arrays_that_fit_are_pinned():
    state = {
        'a': jnp.zeros(100, jnp.float32),  # 400 bytes
        'b': jnp.zeros(60, jnp.float32),  # 240
        'c': jnp.zeros(50, jnp.float32),  # 200
        'd': jnp.zeros(10, jnp.float32),  # 40
    }
    sizes = lambda limit: sorted(leaf.nbytes for leaf in pinned_host.leaves_to_pin(state, limit))  # noqa: E731
    assert sizes(None) == [40, 200, 240, 400]
    assert sizes(700) == [40, 240, 400]  # 400 + 240 fit; 200 would not, 40 does
    assert sizes(100) == [400]  # the largest always: a save cannot split an array


def test_growing_by_bytes_copies_one_buffer_of_that_size_to_pinned_memory(monkeypatch):
    if not any(m.kind == 'pinned_host' for m in jax.devices()[0].addressable_memories()):
        pytest.skip("this jax's CPU device has no 'pinned_host' memory to copy into")
    state = _state()
    assert pinned_host.grow_pinned_host_pool_by(state, 4096) == 0.0  # a CPU run
    copied = []
    real_put = jax.device_put

    def recording_put(x, shardings):
        copied.extend((array.nbytes, sharding.memory_kind) for array, sharding in zip(x, shardings))
        return real_put(x, shardings)

    monkeypatch.setattr(pinned_host.jax, 'default_backend', lambda: 'gpu')
    monkeypatch.setattr(pinned_host.jax, 'device_put', recording_put)
    assert pinned_host.grow_pinned_host_pool_by(state, 4096) > 0.0
    assert copied == [(4096, 'pinned_host')]
    line = pinned_host.pinned_bytes_line(3 * 2**29, 0.25)
    assert line == 'saves: pinned 1.50 GiB of host memory for checkpoint copies in 0.25 s'


def test_the_infinitrain_writer_pins_its_bound_and_one_buffer_more(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver

    asked = []
    monkeypatch.setattr(
        infinitrain_saver, 'grow_pinned_host_pool_by', lambda tree, nbytes: asked.append(nbytes) or 0.5
    )
    monkeypatch.setattr(infinitrain_saver, 'PIECE_BYTES', 64)
    monkeypatch.setattr(infinitrain_saver, 'IN_FLIGHT_BYTES', 1000)
    parts = SimpleNamespace(setup=None, geometry=SimpleNamespace(accumulation=1, data_parallel=1, context=1))
    checkpointer = infinitrain_saver.InfiniTrainCheckpointer(
        str(tmp_path / 'ck'), 'infinitrain', parts, family='gpt2', keep_latest=0, keep_every=0
    )
    params = {'wte': {'embedding': jnp.zeros((10, 8), jnp.float32)}, 'ln_f': {'scale': jnp.zeros(8)}}
    line = checkpointer.prepare(params, None, jnp.asarray([1, 2], jnp.uint32))
    checkpointer.close()
    # wte's 320 bytes in pieces of two 32-byte rows: the largest buffer is 64 bytes
    assert asked == [1000 + 64]
    assert line == pinned_host.pinned_bytes_line(1064, 0.5)
