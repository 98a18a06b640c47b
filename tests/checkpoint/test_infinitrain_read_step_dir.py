"""read_step_dir on the real binary's checkpoints, against a built (not trained) trainer state: the params and
Adam moments land where the files say, the optimizer mismatch cases say what they drop, and the data position
is translated through the batch geometry."""

import jax
import numpy as np
import optax
import pytest

from jax.sharding import PartitionSpec as P

from infinitrain_samples import SAMPLES, unpacked
from piece_digests import piece_digest
from jaxtrain.checkpoint.layout import CheckpointError
from jaxtrain.checkpoint.formats.infinitrain import steps as it
from jaxtrain.checkpoint.formats.infinitrain.trainer import expected_shapes, read_step_dir
from jaxtrain.optim.optimizer import adam_states, put_tree
from jaxtrain.train.setup import build_trainer
from llmc_io import LLMCFormatError
from llmc_io.infinitrain import layout
from llmc_io.infinitrain.statedict import read_state_dict
from llmc_io.tensors import FileLeaf, tree_leaves
from trainer_runs import load_config


@pytest.fixture(scope='module')
def real():
    if not SAMPLES.is_dir():
        pytest.skip(f'{SAMPLES} absent')
    return unpacked()  # read only: a test damages its own copy


def _config(real, family, **overrides):
    """A config of the real files' geometry, starting from head-{family}'s model.bin."""
    settings = {**dict(batch_size=2, sequence_length=64, total_batch_size=128), **overrides}
    return load_config(family, llmc_filepath=str(real / f'head-{family}' / 'model.bin'), **settings)


def _parts(real, family, **overrides):
    return build_trainer(_config(real, family, **overrides))


def test_adam_moments_restored_by_name(real):
    parts = _parts(real, 'llama3', optimizer='adam', beta2=0.999)
    step_dir = real / 'head-llama3' / 'a' / 'checkpoint_step_000010'
    params, opt, record = read_step_dir(step_dir, parts.state.params, parts.state.opt_state, 1, 'adam')
    assert (record['step'], record['data_position'], record['rng'], record['kind']) == (
        10,
        10,
        None,
        'infinitrain',
    )
    assert any('no comma after "vocab_size"' in m for m in record['messages'])
    model = read_state_dict(step_dir / 'model.ckpt')
    optimizer = read_state_dict(step_dir / 'optimizer.ckpt')
    np.testing.assert_array_equal(np.asarray(params['lm_head']['kernel']), model['lm_head.weight'].array.T)
    np.testing.assert_array_equal(
        np.asarray(params['h']['mlp']['c_fc2']['kernel'][1]),
        model['transformer.h.1.mlp.c_fc2.weight'].array.T,
    )
    (adam,) = adam_states(opt)
    order = layout.parameter_order('llama3', 2)
    i = order.index('transformer.h.0.attn.c_attn.weight')
    np.testing.assert_array_equal(
        np.asarray(adam.mu['h']['attn']['c_attn']['kernel'][0]), optimizer[f'adam.m.{i}'].array.T
    )
    np.testing.assert_array_equal(
        np.asarray(adam.nu['wte']['embedding']),
        optimizer[f"adam.v.{order.index('transformer.wte.weight')}"].array,
    )
    assert int(adam.count) == 10
    is_schedule = lambda n: isinstance(n, optax.ScaleByScheduleState)
    schedules = [n for n in jax.tree.leaves(opt, is_leaf=is_schedule) if is_schedule(n)]
    assert [int(n.count) for n in schedules] == [10]  # the learning-rate schedule continues at step 10
    # The PR generation's name-keyed file gives the same state.
    _, opt_pr, record_pr = read_step_dir(
        real / 'pr-llama3' / 'a' / 'checkpoint_step_000010',
        parts.state.params,
        parts.state.opt_state,
        1,
        'adam',
    )
    assert record_pr['kind'] == 'infinitrain-bin'
    for a, b in zip(jax.tree.leaves(opt), jax.tree.leaves(opt_pr)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_optimizer_mismatch_says_what_it_drops(real):
    parts = _parts(real, 'llama3', optimizer='sgd')
    _, opt, record = read_step_dir(
        real / 'head-llama3' / 'a' / 'checkpoint_step_000010',
        parts.state.params,
        parts.state.opt_state,
        1,
        'sgd',
    )
    assert opt is None and any('dropped the Adam moments (m, v, t=10)' in m for m in record['messages'])
    gpt = _parts(real, 'gpt2', optimizer='adam', total_batch_size=256)  # accumulation 2
    _, opt, record = read_step_dir(
        real / 'head-gpt2' / 'a' / 'checkpoint_step_000010', gpt.state.params, gpt.state.opt_state, 2, 'adam'
    )
    assert opt is None and any('has no optimizer file' in m for m in record['messages'])
    assert record['data_position'] == 5  # batch 10 = 5 of our steps of 2 InfiniTrain batches
    with pytest.raises(LLMCFormatError, match='data_batch_idx: expected a multiple of 3'):
        read_step_dir(
            real / 'head-gpt2' / 'a' / 'checkpoint_step_000010',
            gpt.state.params,
            gpt.state.opt_state,
            3,
            'adam',
        )


def test_latest_picks_the_newest_infinitrain_step(real, tmp_path):
    from jaxtrain.checkpoint.resume import resolve_resume

    root = real / 'pr-gpt2' / 'a'
    newest = resolve_resume('latest', str(root), 'infinitrain-bin')[0]
    assert newest == (root / 'checkpoint_step_000020').absolute()  # not checkpoint_final
    # orbax asked (no --checkpoint_format): one line naming the kind there, not "starting fresh"
    with pytest.raises(CheckpointError) as refused:
        resolve_resume('latest', str(root), 'orbax')
    assert 'found InfiniTrain ones (checkpoint_step_000020)' in str(refused.value)
    assert str(refused.value).endswith('pass --checkpoint_format infinitrain-bin')
    assert resolve_resume('latest', str(tmp_path), 'orbax') == (
        None,
        f'resume_from=latest: no committed checkpoint in {tmp_path}; starting fresh',
    )
    explicit = resolve_resume(str(root / 'checkpoint_step_000010'), '', 'orbax')[0]
    assert explicit == root / 'checkpoint_step_000010'  # any kind, whatever the format written


def test_a_damaged_checkpoint_stops_the_run_before_anything_is_touched(real, tmp_path):
    import shutil

    from jaxtrain.checkpoint.layout import CheckpointError
    from trainer_runs import train

    step = tmp_path / 'checkpoint_step_000010'
    shutil.copytree(real / 'head-gpt2' / 'a' / 'checkpoint_step_000010', step)
    (step / 'model.ckpt').write_bytes((step / 'model.ckpt').read_bytes()[:-100])
    config = _config(
        real,
        'gpt2',
        input_bin=str(real / 'head-gpt2' / 'train.bin'),
        optimizer='sgd',
        num_iteration=12,
        resume_from=str(step),
        checkpoint_dir=str(tmp_path / 'out'),
        save_steps=1,
        checkpoint_format='infinitrain',
    )
    with pytest.raises(CheckpointError, match=r"model.ckpt: tensor '[^']+' data: expected \d+ bytes"):
        train(config)
    assert not (tmp_path / 'out').exists() or not list((tmp_path / 'out').iterdir())


def test_other_adam_flavour_keeps_the_moments_and_says_so(real):
    parts = _parts(real, 'llama3', optimizer='adamw')
    _, opt, record = read_step_dir(
        real / 'pr-llama3' / 'a' / 'checkpoint_step_000010',
        parts.state.params,
        parts.state.opt_state,
        1,
        'adamw',
    )
    assert int(adam_states(opt)[0].count) == 10
    assert any('was trained with Adam; its m, v, t continue in adamw' in m for m in record['messages'])


def test_one_kind_per_checkpoint_dir(real):
    from jaxtrain.checkpoint.layout import CheckpointError
    from trainer_runs import train

    root = real / 'head-gpt2' / 'a'
    before = sorted(p.name for p in root.iterdir())
    config = _config(
        real,
        'gpt2',
        input_bin=str(real / 'head-gpt2' / 'train.bin'),
        optimizer='sgd',
        num_iteration=1,
        checkpoint_dir=str(root),
        save_steps=1,
    )
    with pytest.raises(CheckpointError, match='expected only orbax checkpoints, found InfiniTrain ones'):
        train(config)
    assert sorted(p.name for p in root.iterdir()) == before  # Orbax never opened the root


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_leaves_made_on_the_device_are_the_hosts_bit_for_bit(real, family):
    """A restore reads a step's stacked and transposed leaves as FileLeafs (the files' arrays) and
    makes them on the device; bound for several devices they are made on the host. Either way each
    leaf equals NumPy's own stack and transpose of the file's tensors, bit for bit."""
    parts = _parts(real, family, optimizer='adam', beta2=0.999)
    step_dir = real / f'head-{family}' / 'a' / 'checkpoint_step_000010'
    shapes = expected_shapes(parts.state.params)
    lazy = it.read_checkpoint(step_dir, shapes, assemble=False)
    assert isinstance(lazy.params['h']['attn']['c_attn']['kernel'], FileLeaf)
    model = read_state_dict(step_dir / 'model.ckpt')
    num_layers = shapes['h/ln_1/scale'][0]
    reference = np.stack([model[f'transformer.h.{i}.attn.c_attn.weight'].array.T for i in range(num_layers)])
    (adam,) = adam_states(parts.state.opt_state)
    replicated = jax.sharding.NamedSharding(jax.make_mesh((jax.device_count(),), ('all',)), P())
    on_all = jax.device_put(parts.state.params, replicated)
    for like, devices in ((parts.state.params, 1), (on_all, jax.device_count())):
        assert {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(like)} == {devices}
        made = put_tree(like, lazy.params)
        if devices == 1:  # each array put on the device as it was read, then made there and used up
            placed = it.read_checkpoint(step_dir, shapes, assemble=False, place=jax.device_put)
            assert placed.digests == {str(f): piece_digest(f.read_bytes()) for f in step_dir.glob('*.ckpt')}
            kernel = placed.params['h']['attn']['c_attn']['kernel']
            assert all(isinstance(part, jax.Array) for part in kernel.parts)
            from_device = put_tree(like, placed.params, consume=True)
            assert kernel.parts == []
            for a, b in zip(jax.tree.leaves(from_device), jax.tree.leaves(made)):
                np.testing.assert_array_equal(_bits(a), _bits(b))
        np.testing.assert_array_equal(
            np.asarray(made['h']['attn']['c_attn']['kernel'], np.float32), reference
        )
        host = put_tree(like, it.read_checkpoint(step_dir, shapes).params)
        for (path, leaf), expected in zip(jax.tree_util.tree_leaves_with_path(made), jax.tree.leaves(host)):
            assert leaf.sharding == expected.sharding and leaf.dtype == expected.dtype, path
            np.testing.assert_array_equal(_bits(leaf), _bits(expected), err_msg=str(path))
    assert (lazy.moments is None) == (family == 'gpt2')  # the real GPT-2 runs train with SGD
    if lazy.moments is None:
        return
    mu, nu, _ = lazy.moments
    assert any(isinstance(leaf, FileLeaf) for leaf in tree_leaves(mu).values())
    hosted_mu, hosted_nu, _ = it.read_checkpoint(step_dir, shapes).moments
    for lazy_tree, host_tree in ((mu, hosted_mu), (nu, hosted_nu)):
        for made, expected in zip(jax.tree.leaves(put_tree(adam.mu, lazy_tree)), jax.tree.leaves(host_tree)):
            np.testing.assert_array_equal(_bits(made), np.asarray(expected, np.float32).view(np.uint32))


def _bits(array) -> np.ndarray:
    host = np.asarray(array)
    return host.view({2: np.uint16, 4: np.uint32}[host.dtype.itemsize])
