"""The optax optimizer and learning-rate schedule a config asks for.

AdamW follows llm.c: decoupled weight decay on tensors of two or more dimensions only
(embeddings and matmul weights; never biases or norm scales), the update
θ -= lr·(m̂/(√v̂+eps) + wd·θ). `adam` is InfiniTrain's LLaMA-3 optimizer, `sgd` its GPT-2 one.

The state's trees for the checkpoint formats that keep Adam's moments apart (InfiniTrain's, llm.c's):
adam_states finds optax's Adam states, with_adam_moments puts saved moments and counts back in.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxtrain.optim.infinitrain_lr_schedule import ScheduleSpec, learning_rates
from llmc_io.tensors import FileLeaf

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('constant', 'cosine')
# The two spellings of a schedule, each key with its default: jaxtrain's and InfiniTrain's (PR 151).
OWN_SCHEDULE_KEYS = {'lr_schedule': 'constant', 'warmup_steps': 0, 'min_lr_ratio': 0.0}
INFINITRAIN_SCHEDULE_KEYS = {
    'lr_decay_style': 'constant',
    'lr_warmup_iters': 0,
    'lr_warmup_init': 0.0,
    'min_lr': 0.0,
    'lr_decay_iters': 0,
}


def _spelled(config, keys: dict) -> list[str]:
    return [
        f'{key} {config.get(key, default)!r}'
        for key, default in keys.items()
        if config.get(key, default) != default
    ]


def spelled_with_infinitrain_flags(config) -> bool:
    """Whether the run spells its schedule with InfiniTrain's flags (then upstream's checks apply, and an
    `infinitrain` save writes that generation)."""
    return bool(_spelled(config, INFINITRAIN_SCHEDULE_KEYS))


def schedule_spec(config) -> ScheduleSpec | None:
    """The run's schedule in InfiniTrain's terms, or None where only jaxtrain's spelling says it
    (llm.c's warmup, lr·(s+1)/warmup_steps, is none of upstream's). Both spellings at once is an error."""
    own, theirs = _spelled(config, OWN_SCHEDULE_KEYS), _spelled(config, INFINITRAIN_SCHEDULE_KEYS)
    if own and theirs:
        raise ValueError(
            f"{', '.join(own)} and {', '.join(theirs)}: expected one spelling of the schedule, found "
            'both; use jaxtrain\'s (lr_schedule, warmup_steps, min_lr_ratio) or InfiniTrain\'s '
            '(lr_decay_style, lr_warmup_iters, lr_warmup_init, min_lr, lr_decay_iters)'
        )
    lr = config.learning_rate
    # main.cc: lr_decay_iters 0 takes num_iteration (at least 1 here, so that a run of no steps is valid).
    decay_iters = config.get('lr_decay_iters', 0) or max(config.num_iteration, 1)
    if not own:
        return ScheduleSpec(
            config.get('lr_decay_style', 'constant'),
            lr,
            min_lr=config.get('min_lr', 0.0),
            warmup_iters=config.get('lr_warmup_iters', 0),
            warmup_init=config.get('lr_warmup_init', 0.0),
            decay_iters=decay_iters,
        )
    if config.warmup_steps:
        return None
    if (
        config.lr_schedule == 'cosine'
    ):  # optax's cosine_decay_schedule, alpha = min_lr_ratio: the same formula
        return ScheduleSpec('cosine', lr, min_lr=lr * config.min_lr_ratio, decay_iters=decay_iters)
    return ScheduleSpec('constant', lr, decay_iters=decay_iters)


class ReplayedSchedule:
    """An optax schedule that looks the learning rate up in the table infinitrain_lr_schedule replays:
    count k -> the lr of update k + 1, for counts 0..num_iteration (the last one is what a save at the
    final step records as the next lr). A resume from an lr_scheduler.ckpt calls continue_from before
    the train step is first traced, so the values from that step on come from the saved state, as
    upstream's LoadState makes them."""

    def __init__(self, spec: ScheduleSpec, num_iteration: int):
        self.spec, self.length = spec, num_iteration + 1
        self.saved = None  # (step, lr_scheduler.ckpt entries)
        self._table = None

    def continue_from(self, step: int, saved_state: dict) -> None:
        self.saved, self._table = (step, saved_state), None

    @property
    def table(self) -> np.ndarray:
        if self._table is None:
            step, state = self.saved if self.saved else (0, None)
            self._table = learning_rates(self.spec, self.length, saved_state=state, saved_step=step)
        return self._table

    def __call__(self, count):
        if isinstance(count, (int, np.integer)):  # the host asking for a step's lr: no device array
            return jnp.float32(self.table[min(max(int(count), 0), self.length - 1)])
        table = jnp.asarray(self.table)
        return table[jnp.clip(count, 0, table.shape[0] - 1)]


def learning_rate_schedule(config) -> optax.Schedule:
    """InfiniTrain's schedules by its own arithmetic (a constant one is optax's constant: the same
    float32), or jaxtrain's: constant, or cosine down to min_lr_ratio of learning_rate; either
    after warmup_steps of llm.c's linear warmup."""
    spec = schedule_spec(config)
    if spec is not None:
        if spec.style == 'none' or (spec.style == 'constant' and not spec.warmup_iters):
            return optax.constant_schedule(config.learning_rate)
        return ReplayedSchedule(spec, config.num_iteration)
    if config.lr_schedule == 'constant':
        after_warmup = optax.constant_schedule(config.learning_rate)
    else:
        after_warmup = optax.cosine_decay_schedule(
            init_value=config.learning_rate,
            decay_steps=max(config.num_iteration - config.warmup_steps, 1),
            alpha=config.min_lr_ratio,
        )
    if not config.warmup_steps:
        return after_warmup
    return optax.join_schedules([_llmc_warmup(config), after_warmup], boundaries=[config.warmup_steps])


def _llmc_warmup(config) -> optax.Schedule:
    """lr·(s+1)/warmup_steps at step s (counted from 0), as llm.c's get_learning_rate_cosine
    (karpathy/llm.c f1e2ace, llmc/schedulers.h): the first step trains at lr/warmup_steps, not
    at 0, and step warmup_steps-1 reaches the full rate."""
    lr, warmup = config.learning_rate, config.warmup_steps
    return lambda step: lr * (jnp.minimum(step, warmup - 1) + 1) / warmup


def learning_rate_at(schedule: optax.Schedule, step: int) -> float:
    """The schedule's value at `step`, computed on the host's CPU device where there is one:
    on a GPU a schedule's jnp ops would queue behind the train step still running, so the
    loop, which reads each loss one step late, would wait for that step to end."""
    try:
        cpu = jax.local_devices(backend='cpu')[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu: the default device it is
        cpu = None
    with jax.default_device(cpu):
        return float(schedule(step))


def decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def build_optimizer(config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    schedule = learning_rate_schedule(config)
    if config.optimizer == 'adamw':
        tx = optax.adamw(
            schedule,
            b1=config.beta1,
            b2=config.beta2,
            eps=config.eps,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        )
    elif config.optimizer == 'adam':
        tx = optax.adam(schedule, b1=config.beta1, b2=config.beta2, eps=config.eps)
    elif config.optimizer == 'sgd':
        tx = optax.sgd(schedule)
    else:
        raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}; found {config.optimizer!r}")
    if config.grad_clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
    return tx, schedule


# --- the optimizer state, for checkpoint formats that save Adam's moments themselves -----------


def _is_adam(node) -> bool:
    return isinstance(node, optax.ScaleByAdamState)


def _is_schedule(node) -> bool:
    return isinstance(node, optax.ScaleByScheduleState)


def adam_states(opt_state) -> list:
    return [n for n in jax.tree.leaves(opt_state, is_leaf=_is_adam) if _is_adam(n)]


def _to_device(like, value):
    return jax.device_put(np.asarray(value, dtype=like.dtype), like.sharding)


def put_tree(like_tree, numpy_tree, consume: bool = False):
    """numpy_tree on the device, with like_tree's dtypes and shardings: one device_put of every
    leaf, whose transfers then run side by side rather than one after the other. A FileLeaf
    (llmc_io.tensors: a file's layers, untransposed, on the host or already on the device) bound
    for one device is stacked and transposed there; on several, it is made on the host first.
    consume: each FileLeaf's parts leave it as its leaf is made, so that they are freed then and
    the device never holds every part and every leaf at once."""
    likes, structure = jax.tree.flatten(like_tree)
    values = structure.flatten_up_to(numpy_tree)
    placed = [None] * len(likes)
    on_host = [i for i, (like, value) in enumerate(zip(likes, values)) if not _made_on_device(like, value)]
    hosted = [np.asarray(values[i], dtype=likes[i].dtype) for i in on_host]
    for i, array in zip(on_host, jax.device_put(hosted, [likes[i].sharding for i in on_host])):
        placed[i] = array
    for i, (like, value) in enumerate(zip(likes, values)):
        if placed[i] is None:
            parts = tuple(jax.device_put(value.take_parts() if consume else value.parts, like.sharding))
            placed[i] = _assembler(like.sharding)(parts, value.stacked, value.transposed, like.dtype)
            del parts
    return structure.unflatten(placed)


def _made_on_device(like, value) -> bool:
    return isinstance(value, FileLeaf) and len(like.sharding.device_set) == 1


@functools.cache
def _assembler(sharding):
    """A FileLeaf's parts, on the device, into its leaf: stacked, transposed, cast (data movement
    only, so bit for bit what FileLeaf.assemble makes on the host)."""

    def assemble(parts, stacked, transposed, dtype):
        leaf = jnp.stack(parts) if stacked else parts[0]
        leaf = jnp.swapaxes(leaf, -1, -2) if transposed else leaf
        return leaf.astype(dtype)

    return jax.jit(assemble, static_argnums=(1, 2, 3), out_shardings=sharding)


def with_adam_moments(opt_like, mu, nu, adam_count: int, schedule_count: int, consume: bool = False):
    """opt_like with saved Adam moments (mu, nu trees of NumPy arrays or FileLeafs) and counts put
    in: the Adam state's count is the saved t, any schedule's count the step the run continues
    from. consume: as put_tree's (for one Adam state only: the trees are used up)."""

    def restore(node):
        if _is_adam(node):
            return optax.ScaleByAdamState(
                count=_to_device(node.count, adam_count),
                mu=put_tree(node.mu, mu, consume),
                nu=put_tree(node.nu, nu, consume),
            )
        if _is_schedule(node):
            return optax.ScaleByScheduleState(count=_to_device(node.count, schedule_count))
        return node

    return jax.tree.map(restore, opt_like, is_leaf=lambda n: _is_adam(n) or _is_schedule(n))
