"""The InfiniTrain-format saver fetches its entries from the device (saver._HostFetch): a kernel
arrives transposed to the file's (out, in) by the device, so the host writes it as it comes; one
pinned copy is made at a time; and prepare() pins the largest array before step 1. The files are
held, byte for byte, against the synchronous export of the same arrays from NumPy, which
transposes on the host (llmc_io.tensors)."""

import threading
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxtrain.checkpoint.formats.infinitrain import saver as infinitrain_saver
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.trainer import save_step_dir
from llmc_io import tensors
from tiny_models import random_params, tiny_config, tiny_header

RECORD = {'step': 1, 'data_position': 1, 'epoch': 0, 'has_optimizer_state': True}
RNG = jnp.array([0, 42], jnp.uint32)


def _state(family: str, tied: bool):
    header = tiny_header(family, **({'tie_embeddings': True} if tied else {}))
    params = random_params(header, everywhere=True)
    if tied:
        params.pop('lm_head', None)
    params = jax.tree.map(jnp.asarray, params)
    tx = optax.adamw(1e-2)
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)  # moments that are not zeros
    return header, params, opt_state


def _saver(root, family, header):
    parts = SimpleNamespace(  # what a save reads of train/setup.py's TrainerSetup
        setup=SimpleNamespace(model_config=tiny_config(family, **_overrides(header))),
        geometry=SimpleNamespace(accumulation=1, data_parallel=1, context=1),
    )
    saver = infinitrain_saver.InfiniTrainCheckpointer(
        str(root), 'infinitrain', parts, family=family, keep_latest=0, keep_every=0
    )
    return saver, parts


def _overrides(header):
    return {'tie_embeddings': True} if getattr(header, 'tie_embeddings', False) else {}


@pytest.mark.parametrize('family,tied', [('gpt2', False), ('llama3', False), ('llama3', True)])
def test_entries_transposed_on_the_device_write_the_host_export_byte_for_byte(
    tmp_path, monkeypatch, family, tied
):
    header, params, opt_state = _state(family, tied)
    on_host = jax.tree.map(np.asarray, (params, opt_state))
    # The host's transposed copies (copy_into of a view that is not C-contiguous) are what the
    # device's transpose replaces: a save from the device makes none.
    host_transposes = []
    real_copy_into = tensors.copy_into

    def counting_copy_into(out, values):
        if values.ndim == 2 and not values.flags.c_contiguous:
            host_transposes.append(values.shape)
        return real_copy_into(out, values)

    monkeypatch.setattr(tensors, 'copy_into', counting_copy_into)
    saver, parts = _saver(tmp_path / 'ck', family, header)
    saver.prepare(params, opt_state, RNG)
    saver.save(1, params, opt_state, RNG, dict(RECORD))
    saver.close()
    assert host_transposes == []

    monkeypatch.setattr(tensors, 'copy_into', real_copy_into)
    export = save_step_dir(
        tmp_path / 'export',
        1,
        *on_host,
        dict(RECORD, rng=[0, 42]),
        'infinitrain',
        family=family,
        model_config=parts.setup.model_config,
        batches_per_step=1,
    )
    saved = tmp_path / 'ck' / 'checkpoint_step_000001'
    for name in ('model.ckpt', 'optimizer.ckpt', it.TRAINER_STATE):
        assert (saved / name).read_bytes() == (export / name).read_bytes(), name


def test_a_fetched_kernel_layer_is_the_hosts_transpose_and_contiguous():
    leaf = jnp.arange(2 * 3 * 5, dtype=jnp.float32).reshape(2, 3, 5)
    entry = tensors.LeafEntry(infinitrain_saver._HostFetch(leaf), layer=1, transposed=True)
    assert entry.shape == (5, 3)
    got = entry.fetch()
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.asarray(leaf)[1].T)
    np.testing.assert_array_equal(entry.first_rows(2).fetch(), np.asarray(leaf)[1].T[:2])


def test_pinned_copies_are_made_one_at_a_time(tmp_path, monkeypatch):
    # Both files are written at once, each by several threads: without the lock their fetches
    # overlap, and the pinned pool grows past the largest array prepare() pinned.
    header, params, opt_state = _state('gpt2', False)
    in_flight, most = [0], [0]
    count = threading.Lock()
    real_put = jax.device_put

    def slow_put(x, sharding=None, **kwargs):
        if getattr(sharding, 'memory_kind', None) != 'pinned_host':
            return real_put(x, sharding, **kwargs)
        with count:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.002)
        try:
            return jax.block_until_ready(real_put(x, sharding, **kwargs))
        finally:
            with count:
                in_flight[0] -= 1

    if infinitrain_saver.pinned_sharding(jax.devices()[0]) is None:
        pytest.skip("this jax's CPU device has no 'pinned_host' memory to copy into")
    monkeypatch.setattr(infinitrain_saver.jax, 'device_put', slow_put)
    saver, _ = _saver(tmp_path / 'ck', 'gpt2', header)
    saver.save(1, params, opt_state, RNG, dict(RECORD))
    saver.close()
    assert most[0] == 1
    assert (tmp_path / 'ck' / 'checkpoint_step_000001' / 'model.ckpt').exists()


@pytest.mark.parametrize('pinned_s', [0.31, 0.0])
def test_prepare_pins_the_largest_array_alone(tmp_path, monkeypatch, pinned_s):
    header, params, opt_state = _state('gpt2', False)
    grown = []

    def grow(leaves, limit_bytes=None):
        grown.append(leaves)
        return pinned_s

    monkeypatch.setattr(infinitrain_saver, 'grow_pinned_host_pool', grow)
    saver, _ = _saver(tmp_path / 'ck', 'gpt2', header)
    line = saver.prepare(params, opt_state, RNG)
    saver.close()
    (leaves,) = grown
    largest = max(leaf.nbytes for leaf in jax.tree.leaves((params, opt_state)))
    assert [leaf.nbytes for leaf in leaves] == [largest]
    if pinned_s:
        assert line == (
            f'saves: pinned {largest / 2**30:.2f} GiB of host memory for checkpoint copies in 0.31 s'
        )
    else:
        assert line is None
