"""models/lora.py against InfiniTrain's definitions (commit b24d92f, infini_train/src/nn/lora/):
the LoRALinear forward y = Wx + b + (α/r)·x·Aᵀ·Bᵀ and the fold W + (α/r)·B·A in NumPy as
InfiniTrain writes them (W is (out, in) there, our kernel is Wᵀ), A's Kaiming-uniform bound
and B's zeros, the suffix match of the target names, and the refusals of bad ranks and
targets."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from trainer_runs import load_config

from jaxtrain.models import FAMILIES
from jaxtrain.models.lora import LoRALinear, init_lora_params, merged_params, resolve_spec


def test_lora_linear_is_infinitrain_formula():
    rng = np.random.default_rng(0)
    n_in, n_out, rank, alpha = 6, 10, 3, 16.0
    W = rng.normal(size=(n_out, n_in)).astype(np.float32)  # InfiniTrain's weight layout
    b = rng.normal(size=(n_out,)).astype(np.float32)
    A = rng.normal(size=(rank, n_in)).astype(np.float32)
    B = rng.normal(size=(n_out, rank)).astype(np.float32)
    x = rng.normal(size=(2, 5, n_in)).astype(np.float32)
    scale = np.float32(alpha) / np.float32(rank)
    layer = LoRALinear(n_in, n_out, rank=rank, scale=float(scale), rngs=nnx.Rngs(0))
    layer.kernel[...], layer.bias[...] = jnp.asarray(W.T), jnp.asarray(b)
    layer.lora_A[...], layer.lora_B[...] = jnp.asarray(A), jnp.asarray(B)
    expected = x @ W.T + b + scale * ((x @ A.T) @ B.T)
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x))), expected, rtol=1e-5, atol=1e-5)

    # MergeWeights: W' = W + (α/r)·B·A; our kernel is its transpose.
    base = {'h': {'attn': {'c_attn': {'kernel': W.T[None], 'bias': b[None]}}}}
    adapters = {'h': {'attn': {'c_attn': {'lora_A': A[None], 'lora_B': B[None]}}}}
    record = {'rank': rank, 'alpha': alpha, 'modules': ['attn.c_attn']}
    merged = merged_params(base, adapters, record)
    np.testing.assert_allclose(merged['h']['attn']['c_attn']['kernel'][0], (W + scale * (B @ A)).T, rtol=1e-6)
    np.testing.assert_array_equal(merged['h']['attn']['c_attn']['bias'], base['h']['attn']['c_attn']['bias'])


def test_init_is_kaiming_uniform_a_sqrt5_and_zero_b():
    L, rank, n_in, n_out = 2, 8, 300, 40
    abstract = {
        'h': {
            'attn': {
                'c_attn': {
                    'lora_A': jax.ShapeDtypeStruct((L, rank, n_in), jnp.float32),
                    'lora_B': jax.ShapeDtypeStruct((L, n_out, rank), jnp.float32),
                }
            },
            'mlp': {
                'c_proj': {
                    'lora_A': jax.ShapeDtypeStruct((L, rank, n_in), jnp.float32),
                    'lora_B': jax.ShapeDtypeStruct((L, n_out, rank), jnp.float32),
                }
            },
        }
    }
    params = init_lora_params(abstract, seed=42)
    # init::KaimingUniform: gain = sqrt(2 / (1 + a^2)) with a = sqrt(5), std = gain / sqrt(fan_in),
    # bound = sqrt(3) * std; fan_in is A's dim 1 (in_features).
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1.0 + 5.0)) / math.sqrt(n_in)
    for module in (('attn', 'c_attn'), ('mlp', 'c_proj')):
        a = np.asarray(params['h'][module[0]][module[1]]['lora_A'])
        assert np.abs(a).max() <= bound * (1 + 1e-6) and np.abs(a).max() > 0.95 * bound
        assert abs(a.mean()) < 0.05 * bound and abs(a.std() - bound / math.sqrt(3)) < 0.05 * bound
        assert not np.any(np.asarray(params['h'][module[0]][module[1]]['lora_B']))
    a1, a2 = params['h']['attn']['c_attn']['lora_A'], params['h']['mlp']['c_proj']['lora_A']
    assert not np.array_equal(a1, a2)  # each tensor its own draw
    np.testing.assert_array_equal(a1, init_lora_params(abstract, seed=42)['h']['attn']['c_attn']['lora_A'])


def _spec(family, **lora):
    """resolve_spec on the tiny variant's parameter shapes (traced, not initialised)."""
    model_cls, _, variants = FAMILIES[family]
    abstract = nnx.eval_shape(lambda: model_cls(variants['tiny'], rngs=nnx.Rngs(0)))
    return resolve_spec(
        load_config(family, 'tiny', **lora), nnx.to_pure_dict(nnx.split(abstract, nnx.Param)[1]), family
    )


@pytest.mark.parametrize(
    'family, targets, modules',
    [
        ('gpt2', 'c_attn,c_proj', ('attn.c_attn', 'attn.c_proj', 'mlp.c_proj')),  # InfiniTrain's default
        ('gpt2', 'c_attn, mlp.c_proj', ('attn.c_attn', 'mlp.c_proj')),
        ('gpt2', 'attn.c_proj,c_fc', ('attn.c_proj', 'mlp.c_fc')),
        (
            'llama3',
            'c_attn,c_proj,c_fc,c_fc2',
            ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_fc2', 'mlp.c_proj'),
        ),
        ('llama3', 'c_fc2', ('mlp.c_fc2',)),
    ],
)
def test_targets_match_by_suffix_like_infinitrain(family, targets, modules):
    spec = _spec(family, lora_rank=4, lora_target_modules=targets)
    assert spec.modules == modules and spec.rank == 4 and spec.scale == np.float32(16.0) / np.float32(4)


def test_rank_zero_is_no_lora():
    assert _spec('gpt2', lora_rank=0, lora_target_modules='nonsense') is None


@pytest.mark.parametrize(
    'family, lora, named, says',
    [
        ('gpt2', dict(lora_rank=65), 'lora_rank', 'expected at most 64'),  # tiny: C = 64
        ('llama3', dict(lora_rank=65, lora_target_modules='c_fc2'), 'lora_rank', 'mlp.c_fc2, 64 -> 192'),
        (
            'gpt2',
            dict(lora_rank=4, lora_target_modules='c_fc2'),
            'lora_target_modules',
            'matches no projection',
        ),
        (
            'gpt2',
            dict(lora_rank=4, lora_target_modules='q_proj'),
            'lora_target_modules',
            'matches no projection',
        ),
        (
            'gpt2',
            dict(lora_rank=4, lora_target_modules='lm_head'),
            'lora_target_modules',
            'matches no projection',
        ),
        (
            'gpt2',
            dict(lora_rank=4, lora_target_modules='h.0.attn.c_attn'),
            'lora_target_modules',
            'some layers',
        ),
        ('gpt2', dict(lora_rank=4, lora_target_modules=' , '), 'lora_target_modules', 'comma-separated'),
        ('gpt2', dict(lora_rank=-1), 'lora_rank', 'positive rank'),
        ('gpt2', dict(lora_rank=4, lora_alpha=0.0), 'lora_alpha', 'positive'),
        ('gpt2', dict(lora_save_path='x.bin'), 'lora_save_path', 'lora_rank > 0'),
    ],
)
def test_bad_lora_settings_are_one_line_naming_the_flag(family, lora, named, says):
    with pytest.raises(ValueError) as error:
        _spec(family, **lora)
    message = str(error.value)
    assert message.startswith(named + ':') and says in message and '\n' not in message
