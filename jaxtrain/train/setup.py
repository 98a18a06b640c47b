"""What a training run and the benchmark build alike, from one config: the mesh and batch
geometry, the model, the optimizer, the initial sharded state and the jitted steps.

train.run adds data, resume, checkpoints and the loop; bench.build adds a synthetic
batch. Building both from here means the benchmark times exactly the trainer's step.
"""

import dataclasses

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtrain.parallel import mesh as mesh_lib
from jaxtrain.parallel import sharding
from jaxtrain.parallel.pipeline import check_pipeline, make_pipeline_loss_and_grads
from jaxtrain.data.batch_geometry import BatchGeometry, batch_geometry
from jaxtrain.config.checks import check_config
from jaxtrain.models.setup import ModelSetup, setup_model
from jaxtrain.train.optim import build_optimizer
from jaxtrain.train.step import TrainState, make_eval_step, make_train_step


@dataclasses.dataclass
class TrainerSetup:
    mesh: jax.sharding.Mesh
    devices: list
    replicated: NamedSharding
    train_batch_sharding: NamedSharding  # (A, rows, T)
    val_batch_sharding: NamedSharding  # (rows, T)
    geometry: BatchGeometry
    topology: dict  # what the trainer state records about where it was saved
    setup: ModelSetup
    tx: optax.GradientTransformation
    schedule: object  # step -> learning rate
    param_shardings: dict
    opt_shardings: object
    state_shardings: TrainState
    state: TrainState  # step 0: the setup's weights, fresh optimizer state
    train_step: object  # jitted; donates the state
    eval_step: object  # jitted


def build_trainer(config) -> TrainerSetup:
    check_config(config)

    # --- mesh and batch geometry ---
    mesh = mesh_lib.build_mesh(config)
    devices = list(mesh.devices.flat)
    replicated = NamedSharding(mesh, P())
    train_batch_sharding = sharding.batch_sharding(mesh, micro_steps=True)
    val_batch_sharding = sharding.batch_sharding(mesh, micro_steps=False)
    geometry = batch_geometry(
        config.batch_size,
        config.sequence_length,
        config.total_batch_size,
        data_parallel=mesh_lib.data_parallel_size(mesh),
    )
    topology = {
        'platform': devices[0].platform,
        'device_count': len(devices),
        'process_count': jax.process_count(),
        'mesh': dict(mesh.shape),
        'pp_size': mesh_lib.pipeline_size(mesh),  # InfiniTrain's trainer_state.json names it so
        'vpp_size': config.get('virtual_pipeline_parallel', 1),
    }

    # --- model ---
    setup = setup_model(config)
    model_config = setup.model_config
    if config.sequence_length > model_config.max_seq_len:
        raise ValueError(
            f'sequence_length: expected at most the model max_seq_len {model_config.max_seq_len}, '
            f'found {config.sequence_length}'
        )
    check_pipeline(
        model_config.num_layers, topology['pp_size'], topology['vpp_size'], geometry.accumulation
    )

    # --- optimizer and state ---
    tx, schedule = build_optimizer(config)
    param_shardings = sharding.parameter_shardings(setup.params, mesh)
    params = sharding.put_global(setup.params, param_shardings)
    opt_shardings = sharding.opt_state_shardings(jax.eval_shape(tx.init, params), params, mesh)
    state_shardings = TrainState(
        step=replicated,
        data_position=replicated,
        params=param_shardings,
        opt_state=opt_shardings,
        rng=replicated,
    )
    state = TrainState(
        step=sharding.put_global(np.int32(0), replicated),
        data_position=sharding.put_global(np.int32(0), replicated),
        params=params,
        opt_state=jax.jit(tx.init, out_shardings=opt_shardings)(params),
        rng=sharding.put_global(np.asarray(jax.random.key_data(jax.random.PRNGKey(config.seed))), replicated),
    )

    # --- the steps: jitted once with the state's shardings in and out ---
    pipelined = None  # P = 1: the plain micro-step scan
    if topology['pp_size'] > 1:
        pipelined = make_pipeline_loss_and_grads(
            setup.graphdef, model_config.vocab_size, mesh, topology['vpp_size']
        )
    train_step = jax.jit(
        make_train_step(setup.graphdef, tx, model_config.vocab_size, loss_and_grads=pipelined),
        in_shardings=(state_shardings, train_batch_sharding, train_batch_sharding),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    eval_step = jax.jit(
        make_eval_step(setup.graphdef, model_config.vocab_size),
        in_shardings=(param_shardings, val_batch_sharding, val_batch_sharding),
        out_shardings=replicated,
    )
    return TrainerSetup(
        mesh=mesh,
        devices=devices,
        replicated=replicated,
        train_batch_sharding=train_batch_sharding,
        val_batch_sharding=val_batch_sharding,
        geometry=geometry,
        topology=topology,
        setup=setup,
        tx=tx,
        schedule=schedule,
        param_shardings=param_shardings,
        opt_shardings=opt_shardings,
        state_shardings=state_shardings,
        state=state,
        train_step=train_step,
        eval_step=eval_step,
    )
