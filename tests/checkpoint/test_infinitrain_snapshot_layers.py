"""The InfiniTrain-format saver's snapshot holds each stacked leaf as its layers, one device
buffer each (saver._device_copy), so that the background write copies to the host only buffers
the snapshot made and queues no computation on the device behind the train steps. The files are
held, byte for byte, against the synchronous export of the same arrays from NumPy (the host's
own slicing and transposes, llmc_io)."""

import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver
from jaxtrain.checkpoint.formats.infinitrain.trainer import save_step_dir
from tiny_models import random_params, tiny_config, tiny_header

RECORD = {'step': 1, 'data_position': 1, 'epoch': 0, 'has_optimizer_state': True}
RNG = jnp.array([0, 42], jnp.uint32)
FILES = {
    'infinitrain': ('model.ckpt', 'optimizer.ckpt', 'trainer_state.json'),
    'infinitrain-bin': ('model.bin', 'optimizer.bin', 'trainer_state.json'),
}


def _state(family: str, tied: bool):
    overrides = {'tie_embeddings': True} if tied else {}
    params = random_params(tiny_header(family, **overrides), everywhere=True)
    if tied:
        assert 'lm_head' not in params  # a tied LLaMA's head is wte
    params = jax.tree.map(jnp.asarray, params)
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)  # moments that are not zeros
    return overrides, params, opt_state


def _saver(root, fmt, family, overrides):
    parts = SimpleNamespace(  # what a save reads of train/setup.py's TrainerSetup
        setup=SimpleNamespace(model_config=tiny_config(family, **overrides)),
        geometry=SimpleNamespace(accumulation=1, data_parallel=1, context=1),
    )
    saver = infinitrain_saver.InfiniTrainCheckpointer(
        str(root), fmt, parts, family=family, keep_latest=0, keep_every=0
    )
    return saver, parts


def _buffers(snapshot_items) -> set[int]:
    found = set()
    for leaf in jax.tree.leaves(snapshot_items):
        pieces = leaf.pieces if isinstance(leaf, infinitrain_saver._Pieces) else (leaf,)
        found.update(id(piece) for piece in pieces)
    return found


@pytest.mark.parametrize(
    'fmt,family,tied,piece_bytes',
    [
        ('infinitrain', 'gpt2', False, None),
        ('infinitrain', 'llama3', False, None),
        ('infinitrain', 'llama3', True, None),
        ('infinitrain-bin', 'gpt2', False, None),  # llm.c's model file takes each stacked leaf whole
        # leaves over 4 KiB held in row pieces: the embeddings, the head and their moments
        ('infinitrain', 'gpt2', False, 4096),
        ('infinitrain', 'llama3', True, 4096),
        ('infinitrain-bin', 'gpt2', False, 4096),
    ],
)
def test_the_write_copies_only_the_snapshots_buffers_and_matches_the_export(
    tmp_path, monkeypatch, fmt, family, tied, piece_bytes
):
    if piece_bytes is not None:
        monkeypatch.setattr(infinitrain_saver, 'PIECE_BYTES', piece_bytes)
    overrides, params, opt_state = _state(family, tied)
    on_host = jax.tree.map(np.asarray, (params, opt_state))
    copied = []
    real_put = jax.device_put

    def recording_put(x, *args, **kwargs):
        copied.extend(x if isinstance(x, list) else [x])
        return real_put(x, *args, **kwargs)

    monkeypatch.setattr(infinitrain_saver.jax, 'device_put', recording_put)
    saver, parts = _saver(tmp_path / 'ck', fmt, family, overrides)
    saver.prepare(params, opt_state, RNG)
    snapshot = saver.snapshot(params, opt_state, RNG)
    made = _buffers(snapshot.items)
    held = [leaf for leaf in jax.tree.leaves(snapshot.items) if isinstance(leaf, infinitrain_saver._Pieces)]
    stacked = [leaf for leaf in held if leaf.stacked]
    assert len(stacked) == 3 * len(infinitrain_saver.tree_leaves(params['h']))  # params, mu, nu
    in_rows = [leaf for leaf in held if not leaf.stacked]
    if piece_bytes is None:
        assert not in_rows
    else:  # wte (and a LLaMA's head) in the params and both moments, each piece at most 4 KiB
        assert len(in_rows) >= 3 and all(p.nbytes <= piece_bytes for leaf in in_rows for p in leaf.pieces)
    saver.save_snapshot(1, snapshot, dict(RECORD))
    _step_until_written(saver)
    saver.close()
    if infinitrain_saver.pinned_sharding(jax.devices()[0]) is not None:
        assert copied, 'the write fetched through pinned memory'
    assert all(id(x) in made for x in copied)  # nothing cut or computed on the device by the write
    assert all(piece.is_deleted() for leaf in held for piece in leaf.pieces)  # let go once written
    if infinitrain_saver.pinned_sharding(jax.devices()[0]) is not None:
        # Every state-dict entry was copied by the loop; llm.c's model file copies its own.
        assert saver.copies.dispatched_by_loop > 0
        assert (saver.copies.dispatched_by_writer == 0) == (fmt == 'infinitrain')

    export = save_step_dir(
        tmp_path / 'export',
        1,
        *on_host,
        dict(RECORD, rng=[0, 42]),
        fmt,
        family=family,
        model_config=parts.setup.model_config,
        batches_per_step=1,
    )
    saved = tmp_path / 'ck' / 'checkpoint_step_000001'
    for name in FILES[fmt]:
        assert (saved / name).read_bytes() == (export / name).read_bytes(), name


def _step_until_written(saver):
    """As the loop does while a save is written: between two steps (5 ms here), it dispatches
    the write's next copies."""
    written = saver._pending
    while not written.done():
        saver.between_steps()
        time.sleep(0.005)


def test_cuts_hold_the_stacked_leaves_of_the_params_and_both_moments_by_layer():
    _, params, opt_state = _state('llama3', False)
    items = {'params': params, 'opt_state': opt_state, 'rng': RNG}
    flags = [cut == infinitrain_saver.BY_LAYER for cut in infinitrain_saver._cuts(items, 'llama3')]
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(items)]
    flagged = {p for p, f in zip(paths, flags) if f}
    assert flagged and all("['h']" in p for p in flagged)
    # every leaf under 'h' (7 in a LLaMA layer) in the params and in Adam's mu and nu; nothing else
    assert len(flagged) == 3 * 7
    assert not any(f for p, f in zip(paths, flags) if 'wte' in p or 'lm_head' in p or 'count' in p)


def test_a_leaf_over_the_piece_size_is_cut_in_pieces_of_whole_rows(monkeypatch):
    monkeypatch.setattr(infinitrain_saver, 'PIECE_BYTES', 3 * 5 * 4 * 2)  # two rows of (3, 5) fp32
    leaf = jnp.arange(7 * 3 * 5, dtype=jnp.float32).reshape(7, 3, 5)
    small = jnp.arange(8, dtype=jnp.float32)
    items = {'params': {'wte': {'embedding': leaf}, 'ln_f': {'scale': small}}, 'opt_state': None, 'rng': RNG}
    cuts = infinitrain_saver._cuts(items, 'gpt2')
    assert sorted(cuts) == [infinitrain_saver.WHOLE, infinitrain_saver.WHOLE, 2]  # ln_f, rng, wte
    assert infinitrain_saver._largest_buffer(items, cuts) == 2 * 3 * 5 * 4
    copied = infinitrain_saver._device_copy(items, cuts)
    (pieces,) = [c for c in copied if isinstance(c, tuple)]
    assert [p.shape[0] for p in pieces] == [2, 2, 2, 1]
    fetch = infinitrain_saver._HostFetch(infinitrain_saver._Pieces(pieces, stacked=False))
    assert fetch.shape == (7, 3, 5) and fetch.buffers(None) == list(pieces)
    np.testing.assert_array_equal(np.asarray(fetch), np.asarray(leaf))


def test_a_layer_fetched_is_that_layer_and_the_whole_leaf_is_the_stack():
    leaf = jnp.arange(2 * 3 * 5, dtype=jnp.float32).reshape(2, 3, 5)
    (copied,) = infinitrain_saver._device_copy([leaf], (infinitrain_saver.BY_LAYER,))
    fetch = infinitrain_saver._HostFetch(infinitrain_saver._Pieces(copied, stacked=True))
    assert fetch.shape == (2, 3, 5)
    np.testing.assert_array_equal(np.asarray(fetch[1]), np.asarray(leaf)[1])
    np.testing.assert_array_equal(np.asarray(fetch), np.asarray(leaf))
    whole = infinitrain_saver._HostFetch(leaf)
    with pytest.raises(IndexError, match='whole, not by layer'):
        whole[0]


def test_a_leaf_over_several_devices_is_held_whole(monkeypatch):
    monkeypatch.setattr(infinitrain_saver, 'PIECE_BYTES', 64)
    mesh = jax.make_mesh((2,), ('data',), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:2])
    sharded = jax.device_put(
        jnp.zeros((8, 4), jnp.float32), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
    )
    alone = jnp.zeros((8, 4), jnp.float32)  # 128 bytes on one device: two pieces of 4 rows
    items = {'params': {'a': sharded, 'b': alone}, 'opt_state': None, 'rng': RNG}
    assert infinitrain_saver._cuts(items, 'gpt2') == (infinitrain_saver.WHOLE, 4, infinitrain_saver.WHOLE)
