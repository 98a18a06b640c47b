"""Sharded training and checkpoints across topologies, in one process with the 8 fake CPU
devices of conftest.py: a run saved on 8 devices (data 2 × fsdp 4) resumes on 4 (fsdp 2 ×
tensor 2), 2 and 1 device, and a 1-device run resumes on 8, each continuing the
uninterrupted run's losses within 1e-5 (the same tokens every step; only the reduction
order differs). Plus the mesh rules, the parameter shardings and the distributed settings
on their own."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, PartitionSpec as P

from jaxtrain.checkpoint import trainer_state as ckpt_record

from jaxtrain.parallel import platform


from jaxtrain.parallel import sharding
from jaxtrain.checks.config_checks import check_config
from trainer_runs import load_config, train_named

# batch_size is per data-parallel rank: 8 rows of 32 tokens a step are 1 micro-step on 8
# ranks, 2 on 4, 8 on 1.
COMMON = dict(
    num_iteration=6,
    save_steps=3,
    max_checkpoint_keep=10,
    batch_size=1,
    sequence_length=32,
    total_batch_size=256,
    learning_rate=1e-3,
)
EIGHT = dict(num_devices=8, mesh_data=2, mesh_fsdp=4)
TOLERANCE = 1e-5


def run(tmp_path, name, files, **overrides):
    return train_named(tmp_path, name, files, COMMON, **overrides)


@pytest.fixture(scope='module')
def uninterrupted(files, tmp_path_factory):
    """Six steps on 8 devices with FSDP, saving at steps 3 and 6."""
    root = tmp_path_factory.mktemp('uninterrupted')
    losses, out = run(root, 'eight', files, **EIGHT)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    return root / 'eight' / 'ck', losses, out


def assert_continues(losses, reference, steps):
    assert sorted(losses) == list(steps)
    for step in steps:
        assert abs(losses[step] - reference[step]) <= TOLERANCE, (step, losses[step], reference[step])


@pytest.mark.slow
def test_the_saving_topology_is_recorded(uninterrupted):
    root, _, out = uninterrupted
    assert 'mesh data 2 × fsdp 4 × tensor 1' in out and 'DP 8 (data x fsdp) x accumulation 1' in out
    assert '| attention xla | cross-entropy' in out  # the kernels picked, in the banner (CPU: XLA's)
    topology = ckpt_record.read_trainer_state(root / 'checkpoint_step_000003')['topology']
    assert topology == {
        'platform': 'cpu',
        'device_count': 8,
        'process_count': 1,
        'mesh': {'data': 2, 'fsdp': 4, 'tensor': 1},
        'pp_size': 1,
        'vpp_size': 1,
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    'devices,mesh,accumulation',
    [
        (4, dict(mesh_fsdp=2, mesh_tensor=2, mesh_data=1), 4),
        # Covered by 4-fsdp-tensor (an FSDP checkpoint resharded onto a smaller multi-device mesh,
        # accumulation 4, the same lines) and by 1 (onto replicated parameters): one more compile.
        pytest.param(2, {}, 4, marks=pytest.mark.heavy),
        (1, {}, 8),
    ],
    ids=['4-fsdp-tensor', '2-data', '1'],
)
def test_resume_saved_on_8_devices_on_fewer(uninterrupted, files, tmp_path, devices, mesh, accumulation):
    root, reference, _ = uninterrupted
    losses, out = run(
        tmp_path,
        'resumed',
        files,
        num_devices=devices,
        resume_from=str(root / 'checkpoint_step_000003'),
        save_steps=0,  # saves nothing: no snapshot program compiled for this mesh
        **mesh,
    )
    assert_continues(losses, reference, range(4, 7))
    assert f'x accumulation {accumulation} = 256 tokens/step' in out
    assert (
        'topology changed: saved on 8 cpu device(s) in 1 process(es), mesh data 2 × fsdp 4 × tensor 1, '
        f'now {devices} cpu device(s)'
    ) in out


@pytest.mark.slow
def test_resume_saved_on_1_device_on_8(uninterrupted, files, tmp_path):
    _, reference, _ = uninterrupted
    first, _ = run(tmp_path, 'one', files, num_devices=1, num_iteration=3)
    assert_continues(first, reference, range(1, 4))
    losses, out = run(
        tmp_path,
        'eight',
        files,
        resume_from=str(tmp_path / 'one' / 'ck' / 'checkpoint_step_000003'),
        save_steps=0,
        **EIGHT,
    )
    assert_continues(losses, reference, range(4, 7))
    assert 'topology changed: saved on 1 cpu device(s)' in out and 'now 8 cpu device(s)' in out


# --- the mesh ------------------------------------------------------------------------


def test_minus_one_fills_the_remaining_devices():
    assert sharding.mesh_shape(8, -1, 1, 1) == {'data': 8, 'fsdp': 1, 'tensor': 1}
    assert sharding.mesh_shape(8, 2, -1, 2) == {'data': 2, 'fsdp': 2, 'tensor': 2}
    assert sharding.mesh_shape(8, 1, 8, 1) == {'data': 1, 'fsdp': 8, 'tensor': 1}


@pytest.mark.parametrize(
    'sizes,message',
    [
        ((-1, -1, 1), 'mesh: expected at most one size -1, found 2 (mesh_data, mesh_fsdp)'),
        ((-1, 3, 1), 'mesh_data: -1 fills 8 devices, but the other sizes multiply to 3'),
        ((2, 2, 1), 'mesh: expected mesh_data × mesh_fsdp × mesh_tensor = 8 devices, found 2 × 2 × 1 = 4'),
        ((0, 1, 1), 'mesh_data: expected a positive size or -1 (fill), found 0'),
    ],
)
def test_mesh_errors_name_the_key(sizes, message):
    with pytest.raises(ValueError, match=r'^' + message.replace('(', r'\(').replace(')', r'\)')):
        sharding.mesh_shape(8, *sizes)


def test_mesh_from_config_has_auto_axes_and_the_default_is_data_parallel():
    config = load_config('gpt2', num_devices=0)
    mesh = sharding.build_mesh(config)
    assert dict(mesh.shape) == {'data': 8, 'fsdp': 1, 'tensor': 1}
    assert mesh.axis_types == (AxisType.Auto,) * 3
    with pytest.raises(ValueError, match='^num_devices: expected at most the 8 devices present, found 9'):
        sharding.build_mesh(load_config('gpt2', num_devices=9))
    with pytest.raises(ValueError, match='^mesh_tensor: expected a positive size or -1'):
        check_config(load_config('gpt2', mesh_tensor=-2))


# --- parameter and optimizer-state shardings ----------------------------------------


def tiny_params():
    """The tiny GPT-2's shapes (L=2, C=32, V=512) as zeros."""
    L, C, V = 2, 32, 512
    shapes = {
        'wte': {'embedding': (V, C)},
        'wpe': {'embedding': (128, C)},
        'h': {
            'ln_1': {'scale': (L, C), 'bias': (L, C)},
            'attn': {
                'c_attn': {'kernel': (L, C, 3 * C), 'bias': (L, 3 * C)},
                'c_proj': {'kernel': (L, C, C)},
            },
            'mlp': {
                'c_fc': {'kernel': (L, C, 4 * C), 'bias': (L, 4 * C)},
                'c_proj': {'kernel': (L, 4 * C, C)},
            },
        },
        'ln_f': {'scale': (C,)},
    }
    return jax.tree.map(lambda s: np.zeros(s, np.float32), shapes, is_leaf=lambda x: isinstance(x, tuple))


def test_fsdp_and_tensor_parallel_specs_and_real_shards():
    mesh = jax.make_mesh((1, 4, 2), sharding.AXES, axis_types=(AxisType.Auto,) * 3)
    params = tiny_params()
    shardings = sharding.parameter_shardings(params, mesh)
    specs = {name: shardings_of.spec for name, shardings_of in flat(shardings).items()}
    assert specs == {
        'wte/embedding': P(None, 'fsdp'),  # the channel axis, not the vocabulary
        'wpe/embedding': P(None, 'fsdp'),
        'h/ln_1/scale': P(),  # vectors per layer stay whole
        'h/ln_1/bias': P(),
        'h/attn/c_attn/kernel': P(None, 'fsdp'),  # C, never the layer axis L
        'h/attn/c_attn/bias': P(),
        'h/attn/c_proj/kernel': P(None, 'tensor', 'fsdp'),  # row-parallel
        'h/mlp/c_fc/kernel': P(None, 'fsdp', 'tensor'),  # column-parallel
        'h/mlp/c_fc/bias': P(None, 'tensor'),
        'h/mlp/c_proj/kernel': P(None, 'tensor', 'fsdp'),
        'ln_f/scale': P(),
    }
    placed = sharding.put_global(params, shardings)
    kernel = placed['h']['mlp']['c_fc']['kernel']
    assert kernel.sharding.spec == P(None, 'fsdp', 'tensor')
    assert {s.data.shape for s in kernel.addressable_shards} == {(2, 8, 64)}  # (2, 32/4, 128/2)


def test_fsdp_skips_axes_it_does_not_divide():
    mesh = jax.make_mesh((1, 8, 1), sharding.AXES, axis_types=(AxisType.Auto,) * 3)
    assert sharding.parameter_spec('h/attn/c_attn/kernel', (2, 12, 36), mesh) == P()
    assert sharding.parameter_spec('h/attn/c_attn/kernel', (2, 16, 36), mesh) == P(None, 'fsdp')
    # C (12) not divisible: the largest axis that is.
    assert sharding.parameter_spec('h/attn/c_attn/kernel', (2, 12, 48), mesh) == P(None, None, 'fsdp')
    assert sharding.parameter_spec('h/unnamed/kernel', (2, 16, 48), mesh) == P(None, None, 'fsdp')


def test_optimizer_state_follows_its_parameters():
    mesh = jax.make_mesh((2, 4, 1), sharding.AXES, axis_types=(AxisType.Auto,) * 3)
    params = tiny_params()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
    state = jax.eval_shape(tx.init, params)
    shardings = flat(sharding.opt_state_shardings(state, params, mesh))
    assert shardings['1/0/mu/h/attn/c_attn/kernel'].spec == P(None, 'fsdp')
    assert shardings['1/0/nu/wte/embedding'].spec == P(None, 'fsdp')
    assert shardings['1/0/count'].spec == P()


def flat(tree) -> dict:
    from jaxtrain.checkpoint.manager import path_name

    return {path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


# --- distributed settings ------------------------------------------------------------


def distributed_config(**keys):
    return load_config('gpt2', **keys)


def test_one_process_needs_no_settings():
    assert platform.process_group(distributed_config(), {}) is None
    assert platform.process_group(distributed_config(num_processes=1), {}) is None
    assert platform.initialize_distributed(distributed_config(), {}) == ''


def test_settings_from_flags_and_environment():
    group = platform.process_group(
        distributed_config(coordinator_address='localhost:1234', num_processes=2, process_id=1), {}
    )
    assert (group.coordinator_address, group.num_processes, group.process_id) == ('localhost:1234', 2, 1)
    environ = {'JAX_COORDINATOR_ADDRESS': 'h0:99', 'JAX_NUM_PROCESSES': '4', 'JAX_PROCESS_ID': '3'}
    group = platform.process_group(distributed_config(), environ)
    assert (group.coordinator_address, group.num_processes, group.process_id) == ('h0:99', 4, 3)
    # A flag wins over the environment.
    group = platform.process_group(distributed_config(process_id=0), environ)
    assert group.process_id == 0


def test_slurm_is_detected_and_jax_fills_the_rest():
    slurm = {
        'SLURM_JOB_ID': '77',
        'SLURM_STEP_NODELIST': 'gpu[01-02]',
        'SLURM_NTASKS': '16',
        'SLURM_PROCID': '5',
        'SLURM_LOCALID': '5',
    }
    group = platform.process_group(distributed_config(), slurm)
    assert group.source == 'SLURM' and group.coordinator_address is None
    assert platform.process_group(distributed_config(), {**slurm, 'SLURM_NTASKS': '1'}) is None


@pytest.mark.parametrize(
    'keys,message',
    [
        (dict(coordinator_address='h:1', num_processes=2), r'^process_id: expected with the other'),
        (dict(num_processes=2, process_id=0), r'^coordinator_address: expected with the other'),
        (dict(coordinator_address='h:1', num_processes=2, process_id=2), r'^process_id: expected 0\.\.1'),
        (
            dict(coordinator_address='h', num_processes=2, process_id=0),
            r'^coordinator_address: expected host:port',
        ),
    ],
)
def test_incomplete_distributed_settings_are_refused(keys, message):
    with pytest.raises(ValueError, match=message):
        platform.process_group(distributed_config(**keys), {})
