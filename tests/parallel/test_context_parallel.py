"""--context_parallel on the 8 fake CPU devices of conftest.py: attention across the context
axis by each --cp_comm_type against one device's attention (values and gradients), then
whole train steps of GPT-2 and LLaMA-3 with C = 2 against the C = 1 run's losses (within
1e-5: only the reduction order differs), alone and combined with the other axes, and the
config checks and log lines that name C. CI runs GPT-2's three comm types and the pipeline
(whose region is manual over context itself); LLaMA-3's runs, the other combinations and the
Orbax resume are `heavy` (minutes of CPU: -m heavy), GQA being covered by the attention test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtrain.checks.config_checks import check_config
from jaxtrain.data.stream import batch_geometry
from jaxtrain.models.attention import causal_attention
from jaxtrain.parallel import context_parallel, sharding
from jaxtrain.train.run_log import step_line
from jaxtrain.train.setup import build_trainer
from trainer_runs import load_config, random_shard, tiny_llmc_model, train_named

TOLERANCE = 1e-5


def _needs_8_devices():
    if jax.device_count() < 8:
        pytest.skip('needs 8 devices (tests/conftest.py makes 8 fake CPU devices)')


def _reference_attention(q, k, v):
    """NumPy causal attention, query head n reading kv head n // (N/K)."""
    B, T, N, H = q.shape
    k = np.repeat(k, N // k.shape[2], axis=2)
    v = np.repeat(v, N // v.shape[2], axis=2)
    s = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(H)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum('bnts,bsnh->btnh', p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize('comm_type', context_parallel.COMM_TYPES)
def test_attention_across_4_slices_equals_one_device(comm_type):
    _needs_8_devices()
    mesh = jax.make_mesh((2, 4), ('data', 'context'), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    B, T, N, K, H = 2, 16, 4, 4 if comm_type == 'a2a' else 2, 8  # a2a: C divides K
    q, k, v = (rng.normal(size=(B, T, n, H)).astype(np.float32) for n in (N, K, K))
    weights = rng.normal(size=(B, T, N, H)).astype(np.float32)

    def loss(q, k, v, split):
        with context_parallel.attention_across(split):
            y = causal_attention(q, k, v, 'xla')
        return jnp.sum(y * weights), y

    grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    split = context_parallel.ContextSplit(mesh, comm_type)
    placed = jax.device_put((q, k, v), NamedSharding(mesh, P('data', 'context')))
    (_, y), (dq, dk, dv) = jax.jit(lambda *a: grads(*a, split))(*placed)
    np.testing.assert_allclose(np.asarray(y), _reference_attention(q, k, v), atol=2e-6)
    (_, _), one_device = jax.jit(lambda *a: grads(*a, None))(q, k, v)
    for ours, theirs in zip((dq, dk, dv), one_device):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6)


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp('context_parallel')
    return {family: tiny_llmc_model(root / f'{family}.bin', family=family) for family in ('gpt2', 'llama3')}


@pytest.fixture(scope='module')
def references(models):
    """{family: the C = 1 losses} on data 2, computed once per family."""
    cache = {}

    def reference(family):
        if family not in cache:
            cache[family] = _losses(models[family], family, num_devices=2, mesh_data=2)[0]
        return cache[family]

    return reference


TOKENS = np.random.default_rng(0).integers(0, 512, (2, 1, 4, 64))  # (inputs | targets, A, B, T)


def _losses(model, family, **overrides):
    settings = {'batch_size': 2, 'total_batch_size': 4 * 64, 'learning_rate': 1e-3, **overrides}
    config = load_config(family, llmc_filepath=model, **settings)
    check_config(config)
    parts = build_trainer(config)
    inputs, targets = sharding.put_global((TOKENS[0], TOKENS[1]), parts.train_batch_sharding)
    state, losses = parts.state, []
    for _ in range(3):
        state, metrics = parts.train_step(state, inputs, targets)
        losses.append(float(metrics['loss']))
    return losses, parts


@pytest.mark.slow
@pytest.mark.parametrize('family', ['gpt2', pytest.param('llama3', marks=pytest.mark.heavy)])
def test_context_parallel_2_trains_with_the_losses_of_1(models, references, family):
    _needs_8_devices()
    reference = references(family)
    for comm_type in context_parallel.COMM_TYPES:
        losses, parts = _losses(
            models[family], family, num_devices=4, mesh_data=2, context_parallel=2, cp_comm_type=comm_type
        )
        assert parts.parallel_sizes == {'DP': 2, 'TP': 1, 'SP': 1, 'CP': 2, 'PP': 1}
        assert dict(parts.mesh.shape) == {'data': 2, 'fsdp': 1, 'context': 2, 'tensor': 1}
        np.testing.assert_allclose(losses, reference, atol=TOLERANCE, err_msg=comm_type)


@pytest.mark.slow
@pytest.mark.parametrize(
    'family, axes',
    [
        pytest.param(
            'gpt2',
            dict(mesh_data=2, mesh_tensor=2, sequence_parallel=True, cp_comm_type='p2p'),
            marks=pytest.mark.heavy,
        ),
        ('gpt2', dict(mesh_data=2, pipeline_parallel=2, batch_size=1, cp_comm_type='all_gather')),
        pytest.param(
            'llama3',
            dict(mesh_data=1, mesh_fsdp=2, mesh_tensor=2, zero_stage=1, cp_comm_type='a2a'),
            marks=pytest.mark.heavy,
        ),
    ],
    ids=['gpt2-tensor-sequence', 'gpt2-pipeline', 'llama3-fsdp-tensor-zero1'],
)
def test_context_parallel_composes_with_the_other_axes(models, references, family, axes):
    _needs_8_devices()
    reference = references(family)
    losses, parts = _losses(models[family], family, num_devices=8, context_parallel=2, **axes)
    assert parts.parallel_sizes['CP'] == 2
    np.testing.assert_allclose(losses, reference, atol=TOLERANCE)


@pytest.mark.parametrize(
    'overrides, says',
    [
        (dict(num_devices=8, context_parallel=3), 'context_parallel: expected a divisor of the 8 devices'),
        (
            dict(num_devices=2, context_parallel=2, sequence_length=63),
            'expected a multiple of context_parallel 2',
        ),
        (
            dict(num_devices=4, context_parallel=4, cp_comm_type='a2a'),
            "a2a splits the heads over the context devices: expected the model's num_heads 2",
        ),
        (dict(context_parallel=2, cp_comm_type='ring'), 'cp_comm_type: expected one of all_gather, p2p, a2a'),
    ],
)
def test_a_context_split_that_does_not_fit_is_one_line(models, overrides, says):
    _needs_8_devices()
    config = load_config('gpt2', llmc_filepath=models['gpt2'], batch_size=1, total_batch_size=0, **overrides)
    with pytest.raises(ValueError) as error:
        check_config(config)
    assert says in str(error.value) and '\n' not in str(error.value)


def test_the_batch_line_and_the_step_line_name_the_context_size():
    geometry = batch_geometry(4, 64, 0, data_parallel=2, context=2)
    assert geometry.tokens_per_step == 4 * 64 * 2  # context devices share their rows' tokens
    assert (
        geometry.describe()
        == '4 x 64 (CP 2: 32 tokens a slice) x DP 2 (data x fsdp) x accumulation 1 = 512 tokens/step'
    )
    sizes = {'DP': 2, 'TP': 1, 'SP': 1, 'CP': 2, 'PP': 1}
    line = step_line(1, 10, 5.0, 1e-4, 0.5, 512, sizes, (0, 0))
    # example/gpt2/main.cc at d03ba16: '..., DP={}, TP={}, SP={}, CP={}, PP={})'
    assert line.endswith('peak reserved:     0 MB, DP=2, TP=1, SP=1, CP=2, PP=1)')
    assert step_line(1, 10, 5.0, 1e-4, 0.5, 512, {**sizes, 'CP': 1}, (0, 0)).endswith('SP=1, PP=1)')


@pytest.mark.heavy
def test_a_context_parallel_run_resumes_bit_for_bit_on_its_topology(models, tmp_path):
    _needs_8_devices()
    files = dict(input_bin=random_shard(tmp_path / 'train.bin'), llmc_filepath=models['gpt2'])
    common = dict(
        num_iteration=4,
        save_steps=2,
        batch_size=2,
        sequence_length=32,
        total_batch_size=128,
        learning_rate=1e-3,
        num_devices=4,
        mesh_data=2,
        context_parallel=2,
        cp_comm_type='p2p',
    )
    whole, out = train_named(tmp_path, 'whole', files, common)
    assert 'batch: 2 x 32 (CP 2: 16 tokens a slice) x DP 2 (data x fsdp) x accumulation 1' in out
    assert 'DP=2, TP=1, SP=1, CP=2, PP=1)' in out
    resume = str(tmp_path / 'whole' / 'ck' / 'checkpoint_step_000002')
    resumed, out = train_named(tmp_path, 'resumed', files, common, resume_from=resume)
    assert sorted(resumed) == [3, 4] and all(resumed[s] == whole[s] for s in (3, 4))
    assert 'topology(ddp,tp,sp,cp,pp)=(2,1,1,2,1)' in out  # d03ba16 checkpoint.cc:108-109
