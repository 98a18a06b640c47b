"""What a training run and the benchmark build alike, from one config: the mesh and batch
geometry, the model, the optimizer, the initial sharded state and the jitted steps; and what
those are: the training state pytree and the pure train and eval steps.

train.run adds data, resume, checkpoints and the loop; bench.build adds a synthetic
batch. Building both from here means the benchmark times exactly the trainer's step.

Axis letters: A accumulation micro-steps, B rows per micro-step (all data-parallel ranks),
T time.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxtrain.parallel import context_parallel, sharding
from jaxtrain.train.pipeline import make_pipeline_loss_and_grads
from jaxtrain.data.stream import BatchGeometry, batch_geometry
from jaxtrain.data.stream import announce_total_on_mesh
from jaxtrain.models.vocab_table import lm_head_cross_entropy, resolve_cross_entropy
from jaxtrain.checkpoint.resume import apply_init_from
from jaxtrain.models.setup import DTYPES, ModelSetup, setup_model
from jaxtrain.models import precision_check
from jaxtrain.optim.optimizer import build_optimizer


# --- the state and the steps ---


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs to continue bit for bit, as one pytree."""

    step: jax.Array  # int32: optimizer steps completed (the log's step is step + 1)
    data_position: jax.Array  # int32: data windows consumed (see data/stream.py)
    params: dict  # pure nested dict, the layout llmc_io reads and writes (LoRA: the adapters only)
    opt_state: optax.OptState
    rng: jax.Array  # uint32[2]: raw key data, for anything stochastic


def make_loss_fn(graphdef: nnx.GraphDef, vocab_size: int, time_split=None, cross_entropy: str = 'xla'):
    """loss(params, inputs_BxT, targets_BxT, *frozen) with the model rebuilt from its pure
    params; `frozen` (a LoRA run's base weights, models/lora.py) joins them undifferentiated.
    `time_split`: the activations' sharding under sequence parallelism (None: off).
    `cross_entropy`: the loss kernel, 'xla' or 'pallas' (models/vocab_table.py)."""

    def loss_fn(params, inputs_BxT, targets_BxT, *frozen):
        model = nnx.merge(graphdef, nnx.State(params), *(nnx.State(f) for f in frozen))
        head_weight, vocab_axis = model.head_weight()
        with sharding.activations_split(time_split):
            features = model.features(inputs_BxT)
        return lm_head_cross_entropy(
            features, head_weight, targets_BxT, vocab_size, vocab_axis, cross_entropy
        )

    return loss_fn


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    vocab_size: int,
    grad_shardings=None,
    time_split=None,
    checker=None,
    loss_and_grads=None,
    cross_entropy: str = 'xla',
    context=None,
):
    """Returns train_step(state, inputs_AxBxT, targets_AxBxT) -> (state, metrics).

    The reported loss is the mean over micro-steps of each micro-step's mean loss, as
    InfiniTrain prints it; gradients are averaged the same way. `grad_shardings` (ZeRO
    stage 2+, sharding.gradient_shardings) pins every micro-step's gradients and their sum
    to a split layout, so they are reduce-scattered instead of all-reduced.
    `loss_and_grads(params, inputs_AxBxT, targets_AxBxT) -> (loss, grads)`, when given,
    replaces the micro-step scan below with another schedule of the same sums (the
    pipeline's, train/pipeline.py). `context`: context parallelism's split
    (context_parallel.context_split; None: off), under which the whole step is traced, the
    pipeline's schedule included.
    """
    value_and_grad = jax.value_and_grad(make_loss_fn(graphdef, vocab_size, time_split, cross_entropy))

    def grad_fn(params, inputs_BxT, targets_BxT, *frozen):
        loss, grads = value_and_grad(params, inputs_BxT, targets_BxT, *frozen)
        if grad_shardings is not None:
            grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
        return loss, grads

    def train_step(state: TrainState, inputs_AxBxT, targets_AxBxT, *frozen):
        with precision_check.checking(checker, state.step), context_parallel.attention_across(context):
            return _train_step(state, inputs_AxBxT, targets_AxBxT, *frozen)

    def _train_step(state: TrainState, inputs_AxBxT, targets_AxBxT, *frozen):
        accumulation = inputs_AxBxT.shape[0]
        if loss_and_grads is not None:
            loss, grads = loss_and_grads(state.params, inputs_AxBxT, targets_AxBxT)
        elif accumulation == 1:
            loss, grads = grad_fn(state.params, inputs_AxBxT[0], targets_AxBxT[0], *frozen)
        else:

            def micro_step(carry, batch):
                loss_sum, grad_sum = carry
                loss, grads = grad_fn(state.params, *batch, *frozen)
                return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            if grad_shardings is not None:
                zeros = jax.lax.with_sharding_constraint(zeros, grad_shardings)
            (loss, grads), _ = jax.lax.scan(
                micro_step, (jnp.float32(0), zeros), (inputs_AxBxT, targets_AxBxT)
            )
            loss = loss / accumulation
            grads = jax.tree.map(lambda g: g / accumulation, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        new_state = state.replace(
            step=state.step + 1,
            data_position=state.data_position + 1,
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
        )
        metrics = {
            'loss': loss,
            'grad_norm': optax.tree.norm(grads),
            'params_finite': jnp.all(
                jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(new_state.params)])
            ),
        }
        return new_state, metrics

    return train_step


def make_eval_step(
    graphdef: nnx.GraphDef, vocab_size: int, time_split=None, cross_entropy: str = 'xla', context=None
):
    loss_fn = make_loss_fn(graphdef, vocab_size, time_split, cross_entropy)

    def eval_step(params, inputs_BxT, targets_BxT, *frozen):
        with context_parallel.attention_across(context):
            return loss_fn(params, inputs_BxT, targets_BxT, *frozen)

    return eval_step


class WithFrozen:
    """A jitted step with a LoRA run's frozen base weights bound as its last argument: the
    loop calls it as the plain step (and bench lowers it), the weights stay out of the
    donated state, so a step neither copies nor updates them."""

    def __init__(self, jitted, frozen):
        self.jitted, self.frozen = jitted, frozen

    def __call__(self, *args):
        return self.jitted(*args, self.frozen)

    def __getattr__(self, name):
        return getattr(self.jitted, name)

    def lower(self, *args):
        return _Bound(self.jitted.lower(*args, self.frozen), self.frozen)


class _Bound:
    """A Lowered (or Compiled) stage of a WithFrozen step: compile() keeps the binding,
    everything else (cost_analysis, as_text, ...) is the stage's own."""

    def __init__(self, stage, frozen):
        self.stage, self.frozen = stage, frozen

    def compile(self, *args, **kwargs):
        return WithFrozen(self.stage.compile(*args, **kwargs), self.frozen)

    def __getattr__(self, name):
        return getattr(self.stage, name)


# --- building them from a config ---


@dataclasses.dataclass
class TrainerSetup:
    mesh: jax.sharding.Mesh
    devices: list
    replicated: NamedSharding
    train_batch_sharding: NamedSharding  # (A, rows, T)
    val_batch_sharding: NamedSharding  # (rows, T)
    geometry: BatchGeometry
    topology: dict  # what the trainer state records about where it was saved
    parallel_sizes: dict  # {'DP', 'TP', 'SP', 'CP', 'PP'} as InfiniTrain's step line prints them
    setup: ModelSetup
    tx: optax.GradientTransformation
    schedule: object  # step -> learning rate
    param_shardings: dict
    opt_shardings: object
    state_shardings: TrainState
    state: TrainState  # step 0: the setup's weights, fresh optimizer state
    train_step: object  # jitted; donates the state
    eval_step: object  # jitted
    frozen_params: dict | None = None  # a LoRA run's base weights (state.params are the adapters)
    cross_entropy: str = 'xla'  # the loss kernel the steps use (models/vocab_table.py)


def _shape_of(array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(array), array.dtype)


def build_trainer(config) -> TrainerSetup:
    """Builds; checks/config_checks.py's check_config has validated config (the entry points run it)."""
    # --- mesh and batch geometry ---
    mesh = sharding.build_mesh(config)
    devices = list(mesh.devices.flat)
    replicated = NamedSharding(mesh, P())
    train_batch_sharding = sharding.batch_sharding(mesh, micro_steps=True)
    val_batch_sharding = sharding.batch_sharding(mesh, micro_steps=False)
    geometry = batch_geometry(
        config.batch_size,
        config.sequence_length,
        announce_total_on_mesh(config, sharding.data_parallel_size(mesh)),  # e.g. 2 hosts x fsdp 4
        data_parallel=sharding.data_parallel_size(mesh),
        context=sharding.context_size(mesh),
    )
    topology = {
        'platform': devices[0].platform,
        'device_count': len(devices),
        'process_count': jax.process_count(),
        'mesh': dict(mesh.shape),
        'pp_size': sharding.pipeline_size(mesh),  # InfiniTrain's trainer_state.json names it so
        'vpp_size': config.get('virtual_pipeline_parallel', 1),
    }
    parallel_sizes = {
        'DP': geometry.data_parallel,
        'TP': mesh.shape['tensor'],
        'SP': mesh.shape['tensor'] if config.sequence_parallel else 1,  # as InfiniTrain counts it
        'CP': geometry.context,
        'PP': topology['pp_size'],
    }

    # --- model ---
    setup = setup_model(config)
    if config.init_from:  # weights only; the optimizer state below starts fresh
        setup = apply_init_from(config, setup)
    model_config = setup.model_config
    # --- optimizer and state ---
    tx, schedule = build_optimizer(config)
    # A LoRA run trains (and the optimizer and checkpoints hold) the adapters only.
    lora = setup.lora is not None
    trainable = setup.lora_params if lora else setup.params
    zero = config.zero_stage  # ZeRO over the data axis (sharding.py)
    param_shardings = sharding.parameter_shardings(trainable, mesh, zero)
    params = sharding.put_global(trainable, param_shardings)
    if not lora:
        # The state holds the weights now. The tree they came from (a file's or --init_from's on the
        # host, a random init on one device) would otherwise stay alive for the whole run: 32 GB of
        # host memory for an 8B --init_from. A LoRA run keeps it: its records hash the base.
        setup = dataclasses.replace(setup, params=jax.tree.map(_shape_of, setup.params))
    frozen, frozen_shardings = (), ()
    if lora:
        frozen_shardings = (sharding.parameter_shardings(setup.params, mesh, zero),)
        frozen = (sharding.put_global(setup.params, frozen_shardings[0]),)
    opt_shardings = sharding.opt_state_shardings(jax.eval_shape(tx.init, params), params, mesh, zero)
    grad_shardings = sharding.gradient_shardings(trainable, mesh, zero)
    time_split = sharding.time_split_sharding(mesh) if config.sequence_parallel else None
    context = context_parallel.context_split(mesh, config.get('cp_comm_type', 'p2p'))
    checker = None  # --precision_check (precision_check.py)
    checker_config = precision_check.parse(config.precision_check) if config.precision_check else None
    if checker_config is not None and checker_config.level > 0:
        rank = jax.process_index()
        checker = precision_check.PrecisionChecker(checker_config, model_config.num_layers, rank)
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
    cross_entropy = resolve_cross_entropy(
        config.cross_entropy, DTYPES[config.dtype], num_devices=len(devices)
    )
    pipelined = None  # P = 1: the plain micro-step scan
    if topology['pp_size'] > 1:
        pipelined = make_pipeline_loss_and_grads(
            setup.graphdef, model_config.vocab_size, mesh, topology['vpp_size']
        )
    train_step = jax.jit(
        make_train_step(
            setup.graphdef,
            tx,
            model_config.vocab_size,
            grad_shardings,
            time_split,
            checker,
            loss_and_grads=pipelined,
            cross_entropy=cross_entropy,
            context=context,
        ),
        in_shardings=(state_shardings, train_batch_sharding, train_batch_sharding, *frozen_shardings),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    eval_step = jax.jit(
        make_eval_step(setup.graphdef, model_config.vocab_size, time_split, cross_entropy, context),
        in_shardings=(param_shardings, val_batch_sharding, val_batch_sharding, *frozen_shardings),
        out_shardings=replicated,
    )
    if lora:
        train_step, eval_step = WithFrozen(train_step, frozen[0]), WithFrozen(eval_step, frozen[0])
    return TrainerSetup(
        mesh=mesh,
        devices=devices,
        replicated=replicated,
        train_batch_sharding=train_batch_sharding,
        val_batch_sharding=val_batch_sharding,
        geometry=geometry,
        topology=topology,
        parallel_sizes=parallel_sizes,
        setup=setup,
        tx=tx,
        schedule=schedule,
        param_shardings=param_shardings,
        opt_shardings=opt_shardings,
        state_shardings=state_shardings,
        state=state,
        train_step=train_step,
        eval_step=eval_step,
        frozen_params=frozen[0] if lora else None,
        cross_entropy=cross_entropy,
    )
