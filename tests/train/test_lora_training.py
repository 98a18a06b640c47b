"""A LoRA run's train step (train/setup.py with models/lora.py), on tiny llm.c files of both
families: only the adapters change (the base tensors stay bit-identical to the file), the
optimizer state covers the adapters only, the first LoRA step's loss is the plain model's
(B starts at zero), and --lora_rank 0 is exactly the plain run whatever the other lora_*
keys say. Expectations: the llm.c file read back through llmc_io, and plain runs."""

import jax
import numpy as np
import pytest
from trainer_runs import load_config, tiny_llmc_model

import llmc_io
from jaxtrain.parallel import sharding
from jaxtrain.train.setup import build_trainer

# One gpt2 LoRA program for every single-device test here (compiled once): c_fc for a column-parallel target.
TARGETS = {'gpt2': 'c_attn,c_proj,c_fc', 'llama3': 'c_attn,c_proj,c_fc,c_fc2'}


def _batches(parts, steps, vocab=512, seed=0):
    """The same random batch every step: a model that trains at all fits it better each time."""
    shape = (
        parts.geometry.accumulation,
        parts.geometry.rows_per_micro_step,
        parts.geometry.sequence_length + 1,
    )
    for _ in range(steps):
        tokens = np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)
        yield sharding.put_global((tokens[..., :-1], tokens[..., 1:]), parts.train_batch_sharding)


def _run(config, steps):
    parts = build_trainer(config)
    state, parts.state = parts.state, None
    losses = []
    for inputs, targets in _batches(parts, steps):
        state, metrics = parts.train_step(state, inputs, targets)
        losses.append(float(metrics['loss']))
    return parts, state, losses


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.fixture(scope='module')
def gpt2_model(tmp_path_factory):
    return tiny_llmc_model(tmp_path_factory.mktemp('lora_training') / 'model.bin')


@pytest.fixture(scope='module')
def gpt2_lora(gpt2_model):
    """The single-device GPT-2 LoRA run, three steps, that several tests read: (parts, state, losses)."""
    lora = dict(lora_rank=8, lora_target_modules=TARGETS['gpt2'])
    return _run(load_config('gpt2', llmc_filepath=gpt2_model, learning_rate=1e-2, **lora), 3)


@pytest.mark.slow
@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_only_the_adapters_change(tmp_path, family, request):
    if family == 'gpt2':
        model = request.getfixturevalue('gpt2_model')
        parts, state, losses = request.getfixturevalue('gpt2_lora')
    else:
        model = tiny_llmc_model(tmp_path / 'model.bin', family)
        lora = dict(lora_rank=8, lora_target_modules=TARGETS[family])
        config = load_config(family, llmc_filepath=model, learning_rate=1e-2, **lora)
        parts, state, losses = _run(config, 3)
    loader = {'gpt2': llmc_io.load_gpt2, 'llama3': llmc_io.load_llama3}[family]
    file_params = loader(model)[1]
    frozen = jax.tree_util.tree_flatten_with_path(parts.frozen_params)[0]
    expected = dict(jax.tree_util.tree_flatten_with_path(file_params)[0])
    assert len(frozen) == len(expected)
    for path, array in frozen:
        assert np.asarray(array).tobytes() == np.asarray(expected[path], np.float32).tobytes(), path
    # The adapters trained: B left zero, A moved; the optimizer holds the adapters' shapes only.
    initial = parts.setup.lora_params
    for module in parts.setup.lora.modules:
        group, name = module.split('.')
        assert np.any(np.asarray(state.params['h'][group][name]['lora_B']))
        assert not np.array_equal(
            state.params['h'][group][name]['lora_A'], initial['h'][group][name]['lora_A']
        )
    lora_shapes = {x.shape for x in jax.tree.leaves(state.params)}
    assert {x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim} <= lora_shapes
    assert _bytes(state.opt_state) < 0.5 * _bytes(file_params)
    assert losses[2] < losses[0]


@pytest.mark.slow  # three runs compared
def test_rank_zero_is_the_plain_run_and_rank_eight_starts_from_it(gpt2_model, gpt2_lora):
    common = dict(llmc_filepath=gpt2_model, learning_rate=1e-2)
    _, plain, plain_losses = _run(load_config('gpt2', **common), 2)
    _, zero, zero_losses = _run(
        load_config('gpt2', lora_rank=0, lora_alpha=32.0, lora_target_modules='c_fc', **common), 2
    )
    assert zero_losses == plain_losses
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(zero), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # B = 0: the adapted model is the base model at step 1, to the bit.
    _, _, lora_losses = gpt2_lora
    assert lora_losses[0] == plain_losses[0]


@pytest.mark.slow
def test_adapters_shard_like_their_base_over_tensor(gpt2_model, gpt2_lora):
    """InfiniTrain's LoRAColumnParallelLinear / LoRARowParallelLinear: a column-parallel base
    (c_fc) splits B by its output rows, a row-parallel base (c_proj) splits A by its input
    columns; c_attn stays whole here, and so do its adapters. The run matches one device."""
    from jax.sharding import PartitionSpec as P

    common = dict(
        llmc_filepath=gpt2_model, learning_rate=1e-2, lora_rank=8, lora_target_modules=TARGETS['gpt2']
    )
    parts, state, losses = _run(load_config('gpt2', num_devices=2, mesh_tensor=2, **common), 3)
    specs = jax.tree.map(lambda s: s.spec, parts.param_shardings)['h']
    assert specs['mlp']['c_fc'] == {'lora_A': P(), 'lora_B': P(None, 'tensor')}
    assert specs['mlp']['c_proj'] == {'lora_A': P(None, None, 'tensor'), 'lora_B': P()}
    assert specs['attn']['c_proj'] == {'lora_A': P(None, None, 'tensor'), 'lora_B': P()}
    assert specs['attn']['c_attn'] == {'lora_A': P(), 'lora_B': P()}
    assert state.params['h']['mlp']['c_fc']['lora_B'].sharding.spec == P(None, 'tensor')
    _, single, single_losses = gpt2_lora  # the same run on one device
    np.testing.assert_allclose(losses, single_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(single.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
