"""The optax optimizer and learning-rate schedule a config asks for.

AdamW follows llm.c: decoupled weight decay on tensors of two or more dimensions only
(embeddings and matmul weights; never biases or norm scales), the update
θ -= lr·(m̂/(√v̂+eps) + wd·θ). `adam` is InfiniTrain's LLaMA-3 optimizer, `sgd` its GPT-2 one.
"""

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('constant', 'cosine')


def learning_rate_schedule(config) -> optax.Schedule:
    """constant, or cosine down to min_lr_ratio of learning_rate; either after warmup_steps of
    llm.c's linear warmup."""
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
