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
