"""Activation recompute (PR 154's flags): which layers form jax.checkpoint regions, and that a model with
them computes what it computes without them.

The regions are checked against a transcription of upstream's TransformerChunk::Forward switch
(InfiniTensor/InfiniTrain feat/activation_checkpointing e594d9c, transformer.cc), and counted in the traced
program; values against the same model without recompute.
"""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_models import _model_and_params, tiny_config
from trainer_runs import load_config, tiny_llmc_model

from jaxtrain.models.gpt2 import GPT2
from jaxtrain.models.llama3 import LLaMA3
from jaxtrain.models.layer_stack import Recompute, check, segments


def _upstream_regions(num_layers, method, n):
    """transformer.cc (e594d9c): the checkpointed [start, end) ranges of full recompute."""
    regions = []
    if method == 'none':
        regions = [(i, i + 1) for i in range(num_layers)]
    elif method == 'uniform':
        i = 0
        while i < num_layers:
            end = min(i + n, num_layers)
            regions.append((i, end))
            i = end
    elif method == 'block':
        regions = [(i, i + 1) for i in range(min(n, num_layers))]
    return regions


def _regions(num_layers, plan):
    return [
        (first, first + size)
        for start, end, size, recomputed in segments(num_layers, plan)
        if recomputed
        for first in range(start, end, size)
    ]


@pytest.mark.parametrize('method', ['none', 'uniform', 'block'])
def test_regions_are_upstreams(method):
    for num_layers in range(1, 8):
        for n in range(1, 9):
            plan = Recompute('full', method, n if method != 'none' else 0)
            assert _regions(num_layers, plan) == _upstream_regions(num_layers, method, n), (num_layers, n)
            covered = [i for start, end, size, _ in segments(num_layers, plan) for i in range(start, end)]
            assert covered == list(range(num_layers))


def test_flags_map_as_set_activation_recompute_config_does():
    def plan(**kw):
        config = load_config('gpt2', **kw)
        assert check(config) == []
        return Recompute.from_config(config)

    assert plan() == Recompute()  # off by default, whatever the other flags say
    assert plan(recompute_method='uniform', recompute_num_layers=2) == Recompute()
    assert plan(activation_recompute=True) == Recompute('full')
    assert plan(activation_recompute=True, recompute_granularity='selective', recompute_method='block') == (
        Recompute('selective')
    )
    assert plan(activation_recompute=True, recompute_method='block', recompute_num_layers=3) == (
        Recompute('full', 'block', 3)
    )
    bad = load_config('gpt2', activation_recompute=True, recompute_method='uniform')
    assert check(bad) == [
        (
            'recompute_num_layers: expected 1 or more with --recompute_method uniform, found 0; '
            'pass --recompute_num_layers N'
        )
    ]
    assert (
        'recompute_method: expected none, uniform or block'
        in check(load_config('gpt2', recompute_method='x'))[0]
    )


# Three layers: a uniform group of 2 leaves a ragged group of 1, and block 2 leaves layer 2 plain.
CONFIGS = {
    'gpt2': (
        GPT2,
        tiny_config('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16, num_layers=3),
    ),
    'llama3': (
        LLaMA3,
        tiny_config('llama3', max_seq_len=16, vocab_size=48, channels=16, multiple_of=8, num_layers=3),
    ),
}


def _count_regions(jaxpr) -> int:
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith(('checkpoint', 'remat')):
            count += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _count_regions(sub)
    return count


CASES = [  # (family, scan, plan): each plan, both families, scanned and unrolled, in few compiles
    ('gpt2', False, Recompute('full')),
    ('llama3', True, Recompute('full', 'uniform', 2)),
    ('gpt2', False, Recompute('full', 'block', 2)),
    ('llama3', False, Recompute('selective')),
    ('gpt2', True, Recompute('full', 'block', 2)),
]


def _loss_and_jaxpr(family, recompute, scan):
    """The model's sum of squared logits on fixed tokens as a function of its params, and its jaxpr."""
    cls, config = CONFIGS[family]
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, config.vocab_size, (2, 9)))
    model_def, _ = nnx.split(
        nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), scan_layers=scan, recompute=recompute)),
        nnx.Param,
    )
    loss = lambda p: jnp.sum(nnx.merge(model_def, nnx.State(p))(tokens) ** 2)  # noqa: E731
    return loss, jax.make_jaxpr(loss)(_params(family)).jaxpr


@functools.cache
def _params(family):
    cls, config = CONFIGS[family]
    return jax.tree.map(jnp.asarray, _model_and_params(cls, config)[1])


@functools.cache
def _reference(family):
    """Loss and gradients of the unrolled model without recompute, for both layouts (test_models.py
    pins scanned to unrolled): computed once per family for the cases that share it."""
    return jax.jit(jax.value_and_grad(_loss_and_jaxpr(family, Recompute(), False)[0]))(_params(family))


@functools.cache
def _plain_regions(family, scan):
    return _count_regions(_loss_and_jaxpr(family, Recompute(), scan)[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    'family,scan,plan',
    CASES,
    ids=[f"{f}-{'scan' if s else 'unrolled'}-{p.granularity}-{p.method}" for f, s, p in CASES],
)
def test_recompute_gives_the_same_loss_and_gradients(family, scan, plan):
    _, config = CONFIGS[family]
    # Jitted, one program each: run eagerly, every op and region compiled on its own.
    p = _params(family)
    want_loss, want_grads = _reference(family)
    loss, jaxpr = _loss_and_jaxpr(family, plan, scan)
    got_loss, got_grads = jax.jit(jax.value_and_grad(loss))(p)
    assert _plain_regions(family, scan) == 0
    regions = _regions(config.num_layers, plan)
    if scan:  # one region per scan over groups (its body is traced once)
        assert _count_regions(jaxpr) == sum(
            recomputed for *_, recomputed in segments(config.num_layers, plan)
        )
    else:
        assert _count_regions(jaxpr) == len(regions)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_the_flags_reach_the_model(tmp_path):
    from jaxtrain.models.setup import setup_model

    # A 512-id llm.c file: the default config's 50257-id vocabulary costs seconds to initialise.
    model = tiny_llmc_model(tmp_path / 'gpt2.bin')

    def model_of(**keys):
        setup = setup_model(load_config('gpt2', llmc_filepath=model, **keys))
        return nnx.merge(setup.graphdef, nnx.State(jax.tree.map(jnp.asarray, setup.params)))

    on = model_of(activation_recompute=True, recompute_method='uniform', recompute_num_layers=2)
    assert on.recompute == Recompute('full', 'uniform', 2)
    assert model_of().recompute == Recompute()
