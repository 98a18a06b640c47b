"""--fused_kernels: GPT-2 with its residual adds, LayerNorms and bias + GELU as Pallas kernels
(Pallas' interpreter on CPU) computes the loss and gradients of the model without them, the key
reaches the model through setup_model, and it is refused where the kernels cannot run (a LoRA
adapter on c_fc by the model itself too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_config
from trainer_runs import load_config, tiny_llmc_model

from jaxtrain.checks import fit_checks
from jaxtrain.checks.config_checks import check_config
from jaxtrain.models import gpt2
from jaxtrain.models.gpt2 import GPT2, MLP
from jaxtrain.models.lora import LoRASpec
from jaxtrain.models.setup import setup_model

CONFIG = tiny_config('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16)


def _model(fused, dtype, scan):
    # The shapes alone (_random_params replaces every value): an eager init runs op by op.
    model = nnx.eval_shape(
        lambda: GPT2(CONFIG, dtype=dtype, scan_layers=scan, fused_kernels=fused, rngs=nnx.Rngs(0))
    )
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(params)


def _random_params(params, seed=0):
    """Random values everywhere (norm scales and biases too) so no term can hide."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), jnp.float32), params)


def _loss_and_grads(graphdef, params, tokens, grads=True):
    def loss(params):
        logits = nnx.merge(graphdef, nnx.State(params))(tokens[:, :-1]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits[..., : CONFIG.vocab_size])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return jax.jit(jax.value_and_grad(loss) if grads else loss)(params)


@pytest.mark.slow
@pytest.mark.parametrize(
    'fused, dtype, scan, loss_tol, grad_tol',
    [
        ('all', jnp.float32, True, 1e-6, 1e-5),
        ('layernorm', jnp.float32, False, 1e-6, 1e-5),  # unrolled: the carry through a loop
        # Covered by ('all', float32, True): the same bias + GELU kernel in the same scanned model.
        pytest.param('bias_gelu', jnp.float32, True, 1e-6, 1e-5, marks=pytest.mark.heavy),
        # bf16, the loss only: both round the same values to bf16 in slightly different places
        # (the kernels compute pre + bias and the LayerNorm's gradient in fp32, rounding once)
        ('all', jnp.bfloat16, True, 1e-3, None),
    ],
)
def test_the_loss_and_gradients_are_the_unfused_models(fused, dtype, scan, loss_tol, grad_tol):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, CONFIG.vocab_size, (2, 13)))
    graphdef, params = _model('none', dtype, scan)
    fused_graphdef, fused_params = _model(fused, dtype, scan)
    assert jax.tree.structure(params) == jax.tree.structure(fused_params)  # one parameter tree
    params = _random_params(params)
    if grad_tol is None:
        loss = _loss_and_grads(graphdef, params, tokens, grads=False)
        fused_loss = _loss_and_grads(fused_graphdef, params, tokens, grads=False)
        assert abs(float(fused_loss) - float(loss)) <= loss_tol * abs(float(loss))
        return
    loss, grads = _loss_and_grads(graphdef, params, tokens)
    fused_loss, fused_grads = _loss_and_grads(fused_graphdef, params, tokens)
    assert abs(float(fused_loss) - float(loss)) <= loss_tol * abs(float(loss))
    for name, got, want in zip(
        jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(fused_grads), jax.tree.leaves(grads)
    ):
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), atol=grad_tol * scale, err_msg=str(name[0])
        )


@pytest.fixture(scope='module')
def model_file(tmp_path_factory):
    """A 512-id llm.c model file: the default tiny config's 50257-id vocabulary costs seconds per
    model here, and the fused path does not depend on it."""
    return tiny_llmc_model(tmp_path_factory.mktemp('fused') / 'gpt2.bin', vocab=512)


@pytest.mark.slow
@pytest.mark.parametrize('scan', [False, True], ids=['unrolled', 'scanned'])
def test_setup_model_builds_the_fused_model_from_the_config(scan, model_file, monkeypatch):
    """The real path, config to model: fused_kernels 'all' gives the 'none' model's loss, and
    through the kernels (counted where gpt2.py calls them), so a setup that dropped the key fails."""
    monkeypatch.setenv(fit_checks.INTERPRET_ENV, '1')  # the kernels on CPU, through the interpreter
    calls = {'add_layernorm': 0, 'bias_gelu': 0}

    def counted(name, kernel):
        def call(*args, **kwargs):
            calls[name] += 1
            return kernel(*args, **kwargs)

        return call

    monkeypatch.setattr(gpt2, 'add_layernorm', counted('add_layernorm', gpt2.add_layernorm))
    monkeypatch.setattr(gpt2, 'bias_gelu', counted('bias_gelu', gpt2.bias_gelu))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 512, (2, 17)))

    def loss_of(fused):
        config = load_config('gpt2', fused_kernels=fused, scan_layers=scan, llmc_filepath=model_file)
        check_config(config)
        setup = setup_model(config)
        model = nnx.merge(setup.graphdef, nnx.State(jax.tree.map(jnp.asarray, setup.params)))
        logits = jax.jit(lambda t: model(t).astype(jnp.float32))(tokens[:, :-1])
        logp = jax.nn.log_softmax(logits[..., :512])
        return float(-jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)))

    want = loss_of('none')
    assert calls == {'add_layernorm': 0, 'bias_gelu': 0}
    got = loss_of('all')
    assert calls['add_layernorm'] > 0 and calls['bias_gelu'] > 0
    assert got == pytest.approx(want, rel=1e-6)


def test_the_model_refuses_a_lora_c_fc_with_the_bias_gelu_kernel():
    """The kernel path computes c_fc's matmul from the base kernel alone: adapters on c_fc would
    be dropped without a word, so the model refuses them (adapters elsewhere are kept)."""
    # Built as shapes only (the check is the constructor's): an eager init runs op by op.
    lora = LoRASpec(rank=2, alpha=4.0, targets=('c_fc',), modules=('mlp.c_fc',))
    with pytest.raises(ValueError, match='fused_kernels: expected a plain mlp.c_fc'):
        nnx.eval_shape(lambda: MLP(CONFIG, jnp.float32, nnx.Rngs(0), lora=lora, fused_gelu=True))
    nnx.eval_shape(lambda: MLP(CONFIG, jnp.float32, nnx.Rngs(0), lora=lora, fused_gelu=False))
    other = LoRASpec(rank=2, alpha=4.0, targets=('c_proj',), modules=('mlp.c_proj',))
    nnx.eval_shape(lambda: MLP(CONFIG, jnp.float32, nnx.Rngs(0), lora=other, fused_gelu=True))


@pytest.mark.parametrize(
    'keys, message',
    [
        (dict(), "expected a GPU with --fused_kernels all, found 'cpu'"),
        (dict(num_devices=2), 'expected one device with --fused_kernels all'),
        (dict(lora_rank=4), 'expected --lora_rank 0 with --fused_kernels all'),
        (dict(precision_check='level=1'), 'expected no --precision_check with --fused_kernels all'),
    ],
    ids=['cpu', 'devices', 'lora', 'precision-check'],
)
def test_refused_where_the_kernels_cannot_run(keys, message, monkeypatch):
    if 'num_devices' in keys or 'lora_rank' in keys or 'precision_check' in keys:
        monkeypatch.setenv(fit_checks.INTERPRET_ENV, '1')  # past the GPU check, to the one named
    config = load_config('gpt2', fused_kernels='all', **keys)
    with pytest.raises(ValueError, match=message) as error:
        check_config(config)
    assert str(error.value).startswith('fused_kernels: ')


def test_refused_for_llama3_and_a_typo():
    with pytest.raises(
        ValueError,
        match="fused_kernels: expected none for llama3 .*found layernorm; pass --fused_kernels none$",
    ):
        check_config(load_config('llama3', fused_kernels='layernorm'))
    with pytest.raises(
        ValueError, match="fused_kernels: expected one of none, layernorm, bias_gelu, all; found 'yes'"
    ):
        check_config(load_config('gpt2', fused_kernels='yes'))
