"""orbax_host.copy_in_pieces: the host arrays Orbax writes are the ones its own copy gives (held
against Orbax's transfer_arrays_to_host and against the arrays themselves), however the arrays are
cut; 0 gives Orbax its own copy back. The CPU device has a 'pinned_host' memory to copy into."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.serialization import replica_slices

from jaxtrain.checkpoint import orbax_host

ARRAYS = [
    jnp.arange(16 * 8 * 16, dtype=jnp.float32).reshape(16, 8, 16),  # 512 B a row: 1 row a piece
    (jnp.arange(300 * 7) % 251).astype(jnp.bfloat16).reshape(300, 7),  # 14 B a row: 71 rows, 5 pieces
    jnp.float32(3.0),
    jnp.arange(5),
]


@pytest.fixture
def orbax_copy(monkeypatch):
    """Orbax's own copy; whatever a test installs is undone after it."""
    if not any(m.kind == 'pinned_host' for m in jax.devices()[0].addressable_memories()):
        pytest.skip("this jax's CPU device has no 'pinned_host' memory to copy into")
    original = replica_slices.transfer_arrays_to_host
    monkeypatch.setattr(replica_slices, 'transfer_arrays_to_host', original)
    monkeypatch.setattr(orbax_host, '_piece_bytes', orbax_host._piece_bytes)
    monkeypatch.setattr(orbax_host, '_batch_bytes', orbax_host._batch_bytes)
    return original


def test_pieces_are_cut_along_the_first_axis_within_the_size():
    assert [len(orbax_host.row_pieces(a, 1000)) for a in ARRAYS] == [16, 5, 1, 1]
    assert [p.shape[0] for p in orbax_host.row_pieces(ARRAYS[1], 1000)] == [71, 71, 71, 71, 16]
    assert len(orbax_host.row_pieces(ARRAYS[0], 10**6)) == 1  # fits: left whole
    assert len(orbax_host.row_pieces(ARRAYS[0], 10)) == 16  # a row at least


@pytest.mark.parametrize('in_flight', [1, 4])
def test_pieces_reach_the_host_as_orbaxs_own_copy_does(orbax_copy, monkeypatch, in_flight):
    monkeypatch.setattr(orbax_host, 'PIECES_IN_FLIGHT', in_flight)
    orbax_host.copy_in_pieces(1000)
    assert replica_slices.transfer_arrays_to_host is not orbax_copy
    ours = replica_slices.transfer_arrays_to_host(ARRAYS, None, False, enable_pinned_host_transfer=True)
    theirs = orbax_copy(ARRAYS, None, False, enable_pinned_host_transfer=True)
    for mine, reference, array in zip(ours, theirs, ARRAYS):
        assert mine.is_on_host and mine.local_shape == reference.local_shape == array.shape
        (got,), (want,) = mine.replica_slices, reference.replica_slices
        assert got.index == want.index and got.slice_args is None
        assert got.unsliced_data.dtype == want.unsliced_data.dtype == array.dtype
        np.testing.assert_array_equal(got.unsliced_data, np.asarray(jax.device_get(array)))
        np.testing.assert_array_equal(got.unsliced_data, want.unsliced_data)


def test_zero_gives_orbax_its_own_copy_back(orbax_copy):
    orbax_host.copy_in_pieces(1000)
    orbax_host.copy_in_pieces(0)
    assert replica_slices.transfer_arrays_to_host is orbax_copy


def test_more_than_a_batch_at_once_is_orbaxs_own_copy(orbax_copy, monkeypatch):
    cut = []
    monkeypatch.setattr(orbax_host, 'row_pieces', lambda data, size: cut.append(data.shape) or [data])
    orbax_host.copy_in_pieces(1000, batch_bytes=600)
    replica_slices.transfer_arrays_to_host(ARRAYS[:1], None, False, enable_pinned_host_transfer=True)
    assert cut == [(16, 8, 16)]  # one array over the batch size is a batch of its own
    replica_slices.transfer_arrays_to_host(ARRAYS[2:], None, False, enable_pinned_host_transfer=True)
    assert cut == [(16, 8, 16), (), (5,)]  # 4 + 20 bytes: within
    host = replica_slices.transfer_arrays_to_host(ARRAYS, None, False, enable_pinned_host_transfer=True)
    assert len(cut) == 3  # 8192 + 4200 + 24 bytes at once: the live state, copied whole
    np.testing.assert_array_equal(host[1].replica_slices[0].unsliced_data, np.asarray(ARRAYS[1]))


def test_the_pool_is_grown_for_the_pieces_in_flight_of_the_largest_arrays():
    state = {
        'big': jnp.zeros((3, 250), jnp.float32),
        'next': jnp.zeros((4, 100), jnp.float32),
        'small': jnp.ones(2),
    }
    pieces = orbax_host.pieces_to_pin(state, 1000)  # rows of 1000 and 400 bytes
    assert [p.shape for p in pieces] == [(1, 250)] * 3 + [(2, 100)]
    assert len(pieces) == orbax_host.PIECES_IN_FLIGHT


@pytest.mark.parametrize('pieces_from_mb, in_pieces', [(1e-5, True), (1.0, False)])
def test_a_gpu_state_with_an_array_over_the_bound_is_saved_in_pieces(
    tmp_path, orbax_copy, monkeypatch, pieces_from_mb, in_pieces
):
    """prepare() decides from the state's largest array (48 bytes here): pieces, and the pool grown
    for the pieces in flight; or Orbax's own copy, and the pool grown for a batch of whole arrays."""
    from jaxtrain.checkpoint import manager as ckpt_manager

    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0, host_transfer_gb=1)
    grown = []
    monkeypatch.setattr(ckpt_manager, 'grow_pinned_host_pool', lambda tree, limit: grown.append(tree) or 0.0)
    monkeypatch.setattr(ckpt_manager, 'HOST_PIECES_FROM_MB', pieces_from_mb)
    monkeypatch.setattr(ckpt_manager, 'HOST_PIECE_MB', 16e-6)  # 16 bytes: a row of w
    params = {'w': jnp.arange(12.0).reshape(3, 4), 'b': jnp.ones((4,))}
    with monkeypatch.context() as gpu:
        gpu.setattr(ckpt_manager.jax, 'default_backend', lambda: 'gpu')
        checkpointer.prepare(params, None, jnp.array([0, 42], jnp.uint32))
    checkpointer.close()
    copy = replica_slices.transfer_arrays_to_host
    assert (copy is orbax_host._copy_in_pieces) == in_pieces and (copy is orbax_copy) != in_pieces
    (tree,) = grown
    if in_pieces:  # PIECES_IN_FLIGHT rows of w, the largest array
        assert [p.shape for p in tree] == [(1, 4)] * 3 + [(4,)]
    else:
        assert set(tree) == {'params', 'rng'}


@pytest.mark.parametrize('ahead', [1, 0])
def test_orbaxs_batches_are_copied_one_ahead_and_written_as_they_are(
    tmp_path, orbax_copy, monkeypatch, ahead
):
    """A real Orbax save in batches of one array (1 kB), pinned and in pieces of 1000 bytes: each
    batch after the first is the copy made while the one before it was written (none with
    BATCHES_AHEAD 0), and what Orbax wrote reads back as the arrays."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.serialization import worker_memory_utils

    original_batches = worker_memory_utils.next_memory_budgeted_batch
    monkeypatch.setattr(worker_memory_utils, 'next_memory_budgeted_batch', original_batches)
    monkeypatch.setattr(orbax_host, 'BATCHES_AHEAD', ahead)
    copies = []  # the arrays of each copy made, in order, and on which thread
    real = orbax_host._pieces_to_host

    def counted(arrays, replica_args):
        copies.append(([a.shape for a in arrays], threading.current_thread().name))
        return real(arrays, replica_args)

    monkeypatch.setattr(orbax_host, '_pieces_to_host', counted)
    orbax_host.copy_in_pieces(1000, batch_bytes=1000)
    assert worker_memory_utils.next_memory_budgeted_batch is not original_batches
    order = orbax_host.TransferOrder()
    order.in_batches = True
    handler = ocp.PyTreeCheckpointHandler(
        use_compression=False,
        save_device_host_concurrent_gb=1e-6,  # 1000 bytes
        enable_pinned_host_transfer=True,
        type_handler_registry=orbax_host.type_handlers(order),
    )
    tree = {f'a{i}': array for i, array in enumerate(ARRAYS[:2])} | {'c': ARRAYS[0] + 1}
    with ocp.Checkpointer(handler) as checkpointer:
        checkpointer.save(tmp_path / 'step', args=ocp.args.PyTreeSave(tree))
        back = checkpointer.restore(tmp_path / 'step')
    for name, array in tree.items():
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(jax.device_get(array)))
    assert sorted(shapes for shapes, _ in copies) == [[(16, 8, 16)], [(16, 8, 16)], [(300, 7)]]
    ahead_threads = [thread for _, thread in copies if thread.startswith('jaxtrain-copy-ahead')]
    assert len(ahead_threads) == (2 if ahead else 0)  # the second and third batches
    orbax_host.copy_in_pieces(0)
    assert worker_memory_utils.next_memory_budgeted_batch is original_batches
