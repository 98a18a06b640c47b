"""`--fused_adamw`: optax's adamw (or adam) with its update applied by adamw_kernel's fused
Pallas kernels instead of XLA's per-tensor fusions.

FusedAdam wraps the optax transform that build_optimizer would return otherwise, and keeps
its state: init and update are optax's own, so the optimizer state is the same pytree
((clip,) ScaleByAdamState(count, mu, nu), MaskedState, ScaleByScheduleState), and every
checkpoint format, resume and converter reads it unchanged. apply_gradients is the fast
path: clipping, moments, bias correction, weight decay, learning rate and the parameter
update in one pass over each tensor, with the same arithmetic (bitwise on CPU, where Pallas
interprets the kernel).

One GPU: XLA cannot split a Pallas call over a mesh, and off a GPU Pallas' interpreter runs
the kernels slowly, so fit_checks refuses both (the tests set JAXTRAIN_PALLAS_INTERPRET=1).
"""

import jax
import jax.numpy as jnp
import optax

from jaxtrain.optim import adamw_kernel


def apply_gradients(tx, grads, opt_state, params):
    """(new params, new optimizer state): the transform's fused path where it has one, else
    optax's update and apply_updates."""
    fused = getattr(tx, 'apply_gradients', None)
    if fused is not None:
        return fused(grads, opt_state, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _is_counted(node) -> bool:
    return isinstance(node, (optax.ScaleByAdamState, optax.ScaleByScheduleState))


class FusedAdam:
    """An optax GradientTransformation (init, update: the reference's) with apply_gradients.

    reference: the optax chain it stands for, [clip_by_global_norm(grad_clip),] then
    adamw(schedule, b1, b2, eps, weight_decay, mask) or adam (weight_decay 0)."""

    def __init__(
        self,
        reference: optax.GradientTransformation,
        schedule,
        *,
        b1: float,
        b2: float,
        eps: float,
        weight_decay: float = 0.0,
        mask=None,
        grad_clip: float = 0.0,
        interpret=None,
        block: int = adamw_kernel.BLOCK,
        tensors_per_call: int = adamw_kernel.TENSORS_PER_CALL,
    ):
        self.reference, self.schedule = reference, schedule
        self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
        self.mask, self.grad_clip, self.interpret = mask, grad_clip, interpret
        self.block, self.tensors_per_call = block, tensors_per_call

    def init(self, params):
        return self.reference.init(params)

    def update(self, updates, state, params=None):
        return self.reference.update(updates, state, params)

    def apply_gradients(self, grads, state, params):
        counted = [n for n in jax.tree.leaves(state, is_leaf=_is_counted) if _is_counted(n)]
        adam = next(n for n in counted if isinstance(n, optax.ScaleByAdamState))
        scheduled = next(n for n in counted if isinstance(n, optax.ScaleByScheduleState))
        # The scalars, by optax's own expressions: scale_by_adam's count and bias corrections,
        # scale_by_learning_rate's -lr, clip_by_global_norm's norm and trigger.
        count = optax.safe_increment(adam.count)
        scalars = [1 - self.b1**count, 1 - self.b2**count, -1 * self.schedule(scheduled.count)]
        max_norm = None
        if self.grad_clip > 0:
            norm = optax.tree.norm(grads)
            scalars += [norm, jnp.squeeze(norm < self.grad_clip)]
            max_norm = self.grad_clip
        p_list, treedef = jax.tree.flatten(params)
        flat = lambda tree: [x.reshape(-1) for x in treedef.flatten_up_to(tree)]
        decays = treedef.flatten_up_to(self.mask(params)) if self.mask else [True] * len(p_list)
        new_p, new_m, new_v = adamw_kernel.adam_update(
            [p.reshape(-1) for p in p_list],
            flat(grads),
            flat(adam.mu),
            flat(adam.nu),
            decays,
            scalars,
            b1=self.b1,
            b2=self.b2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            max_norm=max_norm,
            block=self.block,
            tensors_per_call=self.tensors_per_call,
            interpret=self.interpret,
        )
        shaped = lambda xs: treedef.unflatten([x.reshape(p.shape) for x, p in zip(xs, p_list)])
        moved = {
            optax.ScaleByAdamState: optax.ScaleByAdamState(count, shaped(new_m), shaped(new_v)),
            optax.ScaleByScheduleState: optax.ScaleByScheduleState(optax.safe_increment(scheduled.count)),
        }
        new_state = jax.tree.map(lambda n: moved.get(type(n), n), state, is_leaf=_is_counted)
        return shaped(new_p), new_state
