"""The training state pytree and the pure, jitted train and eval steps.

Axis letters: A accumulation micro-steps, B rows per micro-step (all data-parallel ranks),
T time.
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxtrain.models.lm_head_loss import lm_head_cross_entropy


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs to continue bit for bit, as one pytree."""

    step: jax.Array  # int32: optimizer steps completed (the log's step is step + 1)
    data_position: jax.Array  # int32: data windows consumed (see data.py)
    params: dict  # pure nested dict, the layout llmc_io reads and writes
    opt_state: optax.OptState
    rng: jax.Array  # uint32[2]: raw key data, for anything stochastic


def make_loss_fn(graphdef: nnx.GraphDef, vocab_size: int):
    """loss(params, inputs_BxT, targets_BxT) with the model rebuilt from its pure params."""

    def loss_fn(params, inputs_BxT, targets_BxT):
        model = nnx.merge(graphdef, nnx.State(params))
        head_weight, vocab_axis = model.head_weight()
        return lm_head_cross_entropy(
            model.features(inputs_BxT), head_weight, targets_BxT, vocab_size, vocab_axis
        )

    return loss_fn


def make_train_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, vocab_size: int, loss_and_grads=None
):
    """Returns train_step(state, inputs_AxBxT, targets_AxBxT) -> (state, metrics).

    The reported loss is the mean over micro-steps of each micro-step's mean loss, as
    InfiniTrain prints it; gradients are averaged the same way. `loss_and_grads(params,
    inputs_AxBxT, targets_AxBxT) -> (loss, grads)`, when given, replaces the micro-step
    scan below with another schedule of the same sums (the pipeline's, parallel/pipeline.py).
    """
    grad_fn = jax.value_and_grad(make_loss_fn(graphdef, vocab_size))

    def train_step(state: TrainState, inputs_AxBxT, targets_AxBxT):
        accumulation = inputs_AxBxT.shape[0]
        if loss_and_grads is not None:
            loss, grads = loss_and_grads(state.params, inputs_AxBxT, targets_AxBxT)
        elif accumulation == 1:
            loss, grads = grad_fn(state.params, inputs_AxBxT[0], targets_AxBxT[0])
        else:

            def micro_step(carry, batch):
                loss_sum, grad_sum = carry
                loss, grads = grad_fn(state.params, *batch)
                return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
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


def make_eval_step(graphdef: nnx.GraphDef, vocab_size: int):
    loss_fn = make_loss_fn(graphdef, vocab_size)

    def eval_step(params, inputs_BxT, targets_BxT):
        return loss_fn(params, inputs_BxT, targets_BxT)

    return eval_step
