"""The training state pytree and the pure, jitted train and eval steps.

Axis letters: A accumulation micro-steps, B rows per micro-step (all data-parallel ranks),
T time.
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxtrain.models.vocab_table import lm_head_cross_entropy
from jaxtrain.models import precision_check
from jaxtrain.parallel import context_parallel, sharding


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
