"""Checkpointer.save returns before the device copy and survives the next donating step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxtrain.checkpoint import layout as ckpt_layout
from jaxtrain.checkpoint import manager as ckpt_manager
from jaxtrain.checkpoint.formats.orbax import restore as orbax_format

RECORD = {'step': 1, 'data_position': 1, 'epoch': 0, 'has_optimizer_state': True}
RNG = jnp.array([0, 42], jnp.uint32)


def _state():
    params = {'w': jnp.arange(12.0).reshape(3, 4), 'b': jnp.ones((4,))}
    tx = optax.adam(1e-2)
    return tx, params, tx.init(params)


@jax.jit
def _add_one(tree):
    return jax.tree.map(lambda x: x + 1, tree)


_donating_step = jax.jit(_add_one.__wrapped__, donate_argnums=0)


@pytest.mark.parametrize('room_on_device', [True, False])
def test_saved_values_are_those_at_save_time_even_after_donation(tmp_path, monkeypatch, room_on_device):
    monkeypatch.setattr(ckpt_manager, 'room_for_snapshot', lambda needed: room_on_device)
    _, params, opt_state = _state()
    expected = jax.tree.map(
        lambda x: np.array(x, copy=True), (params, opt_state)
    )  # no view: views block donation
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0)
    checkpointer.save(1, params, opt_state, RNG, dict(RECORD))
    # The trainer's next step donates (deletes) the live buffers right after save() returns.
    new_params, new_opt_state = _donating_step((params, opt_state))
    # Nothing of the save holds the live buffers when it works from a snapshot. (The
    # blocking path finishes with them before save() returns; on CPU, Orbax's host copy may
    # stay a view, which makes JAX copy instead of donating.)
    assert params['w'].is_deleted() or not room_on_device
    checkpointer.close()
    assert checkpointer.blocking_saves == (0 if room_on_device else 1)

    restored, restored_opt, record = orbax_format.restore(
        tmp_path / 'checkpoint_step_000001', new_params, new_opt_state
    )
    for got, want in zip(jax.tree.leaves((restored, restored_opt)), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)
    # Checksums were added to the record (and verified by restore).
    assert set(record['checksums']) == {'params', 'opt_state'} and 'w' in record['checksums']['params']
    assert record['step'] == 1 and record['rng'] == [0, 42]


def test_snapshot_is_a_separate_buffer():
    tree = {'w': jnp.arange(6.0)}
    copy, sums = ckpt_manager._snapshot(tree)
    assert sums.shape == (1, 2)  # the two checksums of start_tensor_sums, per leaf
    assert copy['w'].unsafe_buffer_pointer() != tree['w'].unsafe_buffer_pointer()
    np.testing.assert_array_equal(copy['w'], tree['w'])


def testroom_for_snapshot_reads_device_memory(monkeypatch):
    tree = {'w': jnp.zeros((1000,), jnp.float32)}  # 4000 bytes
    device = tree['w'].devices().pop()

    class Stats:
        def __init__(self, free):
            self.free = free

        def __call__(self):
            return {'bytes_limit': 10_000, 'bytes_in_use': 10_000 - self.free}

    monkeypatch.setattr(type(device), 'memory_stats', lambda self: Stats(6000)())
    needed = ckpt_manager.bytes_per_device(tree)
    assert needed == {device: 4000}
    assert ckpt_manager.room_for_snapshot(needed)  # 6000 free >= 1.25 x 4000
    monkeypatch.setattr(type(device), 'memory_stats', lambda self: Stats(4500)())
    assert not ckpt_manager.room_for_snapshot(needed)


def test_a_failed_handoff_surfaces_at_wait(tmp_path, monkeypatch):
    _, params, opt_state = _state()
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0)

    def broken_save(*args, **kwargs):
        raise OSError('No space left on device')

    monkeypatch.setattr(checkpointer.manager, 'save', broken_save)
    checkpointer.save(1, params, opt_state, RNG, dict(RECORD))  # returns: the failure is in the thread
    with pytest.raises(
        ckpt_layout.CheckpointError, match='could not save checkpoint_step_000001: No space left'
    ):
        checkpointer.wait()


def test_two_stage_save_from_a_prepared_program_keeps_the_snapshot_time_values(tmp_path):
    # The loop's order (train/loop.py): prepare before step 1; at a save step, snapshot() while
    # the step may still run, then save_snapshot() once its loss is read; the next step donates.
    _, params, opt_state = _state()
    expected = jax.tree.map(lambda x: np.array(x, copy=True), (params, opt_state))
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0)
    checkpointer.prepare(params, opt_state, RNG)
    snapshot = checkpointer.snapshot(params, opt_state, RNG)
    assert isinstance(checkpointer._snapshot_program, jax.stages.Compiled)  # compiled ahead of the save
    assert snapshot.copied
    new_params, new_opt_state = _donating_step((params, opt_state))
    assert params['w'].is_deleted()
    checkpointer.save_snapshot(1, snapshot, dict(RECORD))
    checkpointer.close()
    restored, restored_opt, _ = orbax_format.restore(
        tmp_path / 'checkpoint_step_000001', new_params, new_opt_state
    )
    for got, want in zip(jax.tree.leaves((restored, restored_opt)), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('pinned_s', [0.72, 0.0])
def test_prepare_grows_the_pinned_pool_with_the_saved_items(tmp_path, monkeypatch, pinned_s):
    """prepare() hands grow_pinned_host_pool every array a save copies (params, the optimizer
    state, the rng), and returns the start line that says so; no line where nothing was pinned
    (a CPU, where the real function returns 0.0)."""
    grown = []

    def grow(tree, limit_bytes=None):
        grown.append(tree)
        return pinned_s

    monkeypatch.setattr(ckpt_manager, 'grow_pinned_host_pool', grow)
    _, params, opt_state = _state()
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0)
    line = checkpointer.prepare(params, opt_state, RNG)
    checkpointer.close()
    (tree,) = grown
    assert set(tree) == {'params', 'opt_state', 'rng'}
    for got, want in zip(
        jax.tree.leaves((tree['params'], tree['opt_state'])), jax.tree.leaves((params, opt_state))
    ):
        assert got is want  # the live arrays themselves, as a save copies them
    np.testing.assert_array_equal(tree['rng'], RNG)
    # 16 fp32 params, Adam's two moments of them and its int32 count, the rng's two uint32 words.
    nbytes = 16 * 4 * 3 + 4 + 2 * 4
    if pinned_s:
        assert (
            line == f'saves: pinned {nbytes / 2**30:.2f} GiB of host memory for checkpoint copies in 0.72 s'
        )
    else:
        assert line is None


def test_a_snapshot_never_saved_writes_nothing(tmp_path):
    # A step found non-finite after its snapshot was taken: the run stops, the copy is dropped.
    _, params, opt_state = _state()
    checkpointer = ckpt_manager.Checkpointer(str(tmp_path), keep_latest=0, keep_every=0)
    checkpointer.snapshot(params, opt_state, RNG)
    checkpointer.close()
    assert list(tmp_path.iterdir()) == []


def _infinitrain_saver(root):
    from types import SimpleNamespace

    from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver
    from tiny_models import tiny_config

    parts = SimpleNamespace(  # what a save reads of train/setup.py's TrainerSetup
        setup=SimpleNamespace(model_config=tiny_config('gpt2')),
        geometry=SimpleNamespace(accumulation=1, data_parallel=1, context=1),
    )
    saver = infinitrain_saver.InfiniTrainCheckpointer(
        str(root), 'infinitrain', parts, family='gpt2', keep_latest=0, keep_every=0
    )
    return saver, parts


def _tiny_gpt2_state():
    from tiny_models import random_params, tiny_header

    params = jax.tree.map(jnp.asarray, random_params(tiny_header('gpt2'), everywhere=True))
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)  # moments that are not zeros
    return params, opt_state


def test_a_background_infinitrain_save_is_the_synchronous_export_of_that_step(tmp_path):
    # The loop's order: snapshot, the next step donates the live state, then the write goes on
    # in the background; the files must be those of the state at the snapshot, byte for byte.
    from jaxtrain.checkpoint.formats.infinitrain import steps as it
    from jaxtrain.checkpoint.formats.infinitrain.trainer import save_step_dir

    params, opt_state = _tiny_gpt2_state()
    at_snapshot = jax.tree.map(lambda x: np.array(x, copy=True), (params, opt_state))
    saver, parts = _infinitrain_saver(tmp_path / 'ck')
    saver.prepare(params, opt_state, RNG)
    snapshot = saver.snapshot(params, opt_state, RNG)
    _donating_step((params, opt_state))
    assert params['wte']['embedding'].is_deleted()
    saver.save_snapshot(1, snapshot, dict(RECORD))
    saver.close()
    assert saver.blocking_saves == 0
    export = save_step_dir(
        tmp_path / 'export',
        1,
        *at_snapshot,
        dict(RECORD, rng=[0, 42]),
        'infinitrain',
        family='gpt2',
        model_config=parts.setup.model_config,
        batches_per_step=1,
    )
    saved = tmp_path / 'ck' / 'checkpoint_step_000001'
    for name in ('model.ckpt', 'optimizer.ckpt', it.TRAINER_STATE):
        assert (saved / name).read_bytes() == (export / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / 'ck').iterdir()) == ['checkpoint_step_000001']


def test_a_failed_background_infinitrain_save_stops_the_next_one(tmp_path, monkeypatch):
    # The disk fills while optimizer.ckpt is written, after model.ckpt is complete: the step must
    # not look committed, and the next save stops the run with the failure.
    import errno

    from jaxtrain.checkpoint.formats.infinitrain import steps as it
    from jaxtrain.checkpoint.formats.infinitrain import writer

    real_write = writer.write_state_dict

    def fill_the_disk(path, tensors):
        if path.name == 'optimizer.ckpt':
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real_write(path, tensors)

    monkeypatch.setattr(writer, 'write_state_dict', fill_the_disk)
    params, opt_state = _tiny_gpt2_state()
    saver, _ = _infinitrain_saver(tmp_path / 'ck')
    saver.save(1, params, opt_state, RNG, dict(RECORD))  # returns: the write is in the background
    with pytest.raises(ckpt_layout.CheckpointError, match='could not save checkpoint_step_000001: No space'):
        saver.snapshot(params, opt_state, RNG)  # the next save
    saver.close()
    assert it.step_dirs(tmp_path / 'ck') == [] and list((tmp_path / 'ck').iterdir()) == []
