"""Host memory of Orbax saves and restores, bounded.

A save of a private snapshot is copied off the device a batch of at most host_transfer_gb at a
time (each batch written before the next is copied), so host memory holds a batch, not the state;
a save of the live state (no room on the device for a snapshot) is copied all at once before
save() returns, since the next step donates it. Orbax's own copy routine is watched: what it is
asked to copy, in how many calls; and the checkpoint still restores bit for bit.

A restore reads at most RESTORE_CONCURRENT_GB of an item at a time (Orbax's byte limiter is
watched), or more where one array is larger, which Orbax would otherwise refuse to read.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.serialization import limits, replica_slices

from jaxtrain.checkpoint import manager as manager_module
from jaxtrain.checkpoint.formats.orbax import restore as restore_module
from jaxtrain.checkpoint.formats.orbax.restore import restore
from jaxtrain.checkpoint.manager import Checkpointer

LIMIT_GB = 0.01  # 10 MB a batch
ARRAY_BYTES = 4 * 10**6


@pytest.fixture
def copies(monkeypatch):
    """The byte count of every call Orbax makes to copy arrays off the device."""
    calls = []
    real = replica_slices.transfer_arrays_to_host

    def watched(arrays, *args, **kwargs):
        calls.append(sum(array.nbytes for array in arrays))
        return real(arrays, *args, **kwargs)

    monkeypatch.setattr(replica_slices, 'transfer_arrays_to_host', watched)
    return calls


def _state():
    keys = jax.random.split(jax.random.key(7), 8)
    params = {f'w{i}': jax.random.normal(keys[i], (ARRAY_BYTES // 4,)) for i in range(4)}
    opt_state = {
        'mu': {name: jax.random.normal(keys[4 + i], w.shape) for i, (name, w) in enumerate(params.items())},
        'count': jnp.asarray(3, jnp.int32),
    }
    return params, opt_state, jnp.asarray([5, 6], jnp.uint32)


def _save(root, params, opt_state, rng):
    checkpointer = Checkpointer(str(root), keep_latest=2, keep_every=0, host_transfer_gb=LIMIT_GB)
    checkpointer.save(1, params, opt_state, rng, {'step': 1})
    checkpointer.wait()
    checkpointer.close()
    return checkpointer.step_dir(1)


def _restored(step_dir, params, opt_state, monkeypatch):
    monkeypatch.setattr(restore_module, 'check_resumable', lambda *a: None)  # the record holds only the step
    like = lambda tree: jax.tree.map(jnp.zeros_like, tree)  # noqa: E731
    restored_params, restored_opt, _ = restore(step_dir, like(params), like(opt_state))
    return restored_params, restored_opt


def test_a_snapshot_is_copied_in_batches_within_the_limit(tmp_path, copies, monkeypatch):
    params, opt_state, rng = _state()
    step_dir = _save(tmp_path, params, opt_state, rng)
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves((params, opt_state)))
    assert sum(copies) == state_bytes  # every array once (the rng is a record field, not an array)
    assert max(copies) <= LIMIT_GB * 10**9
    assert len(copies) >= 4  # 8 arrays of 4 MB in batches of at most 10 MB, each item apart
    restored_params, restored_opt = _restored(step_dir, params, opt_state, monkeypatch)
    jax.tree.map(np.testing.assert_array_equal, (params, opt_state), (restored_params, restored_opt))


def test_the_live_state_is_copied_at_once(tmp_path, copies, monkeypatch):
    monkeypatch.setattr(manager_module, 'room_for_snapshot', lambda *a: False)
    params, opt_state, rng = _state()
    step_dir = _save(tmp_path, params, opt_state, rng)
    item_bytes = [sum(leaf.nbytes for leaf in jax.tree.leaves(item)) for item in (params, opt_state)]
    assert sorted(copies) == sorted(item_bytes)  # one call per item, its arrays all together
    restored_params, restored_opt = _restored(step_dir, params, opt_state, monkeypatch)
    jax.tree.map(np.testing.assert_array_equal, (params, opt_state), (restored_params, restored_opt))


@pytest.fixture
def reads_in_flight(monkeypatch):
    """The limit of every byte limiter Orbax makes, and the most bytes any held at once."""
    seen = {'limits': [], 'most': 0}

    class Watched(limits.LimitInFlightBytes):
        def __init__(self, num_bytes):
            super().__init__(num_bytes)
            seen['limits'].append(num_bytes)

        async def wait_for_bytes(self, requested_bytes):
            await super().wait_for_bytes(requested_bytes)
            seen['most'] = max(seen['most'], self.max_bytes - self._available_bytes)

    monkeypatch.setattr(limits, 'LimitInFlightBytes', Watched)
    return seen


def test_a_restore_reads_within_the_limit(tmp_path, reads_in_flight, monkeypatch):
    params, opt_state, rng = _state()
    step_dir = _save(tmp_path, params, opt_state, rng)
    reads_in_flight['limits'].clear()  # the save's own
    monkeypatch.setattr(restore_module, 'RESTORE_CONCURRENT_GB', LIMIT_GB)
    restored_params, restored_opt = _restored(step_dir, params, opt_state, monkeypatch)
    assert reads_in_flight['limits'] == [LIMIT_GB * 10**9] * 2  # one limiter per item
    assert ARRAY_BYTES < reads_in_flight['most'] <= LIMIT_GB * 10**9  # several arrays at once, within it
    jax.tree.map(np.testing.assert_array_equal, (params, opt_state), (restored_params, restored_opt))


def test_an_array_over_the_limit_raises_it(tmp_path, reads_in_flight, monkeypatch):
    params, opt_state, rng = _state()
    step_dir = _save(tmp_path, params, opt_state, rng)
    reads_in_flight['limits'].clear()  # the save's own
    monkeypatch.setattr(restore_module, 'RESTORE_CONCURRENT_GB', ARRAY_BYTES / 2 / 10**9)
    restored_params, restored_opt = _restored(step_dir, params, opt_state, monkeypatch)
    assert reads_in_flight['limits'] == [2 * ARRAY_BYTES] * 2  # twice the largest array
    jax.tree.map(np.testing.assert_array_equal, (params, opt_state), (restored_params, restored_opt))
