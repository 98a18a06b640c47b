"""The optax optimizer and learning-rate schedule a config asks for.

AdamW follows llm.c: decoupled weight decay on tensors of two or more dimensions only
(embeddings and matmul weights; never biases or norm scales), the update
θ -= lr·(m̂/(√v̂+eps) + wd·θ). `adam` is InfiniTrain's LLaMA-3 optimizer, `sgd` its GPT-2 one.
"""

import jax
import optax

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('constant', 'cosine')


def learning_rate_schedule(config) -> optax.Schedule:
    """constant, or linear warmup to learning_rate then cosine down to min_lr_ratio of it."""
    if config.lr_schedule == 'constant':
        if config.warmup_steps:
            return optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
        return optax.constant_schedule(config.learning_rate)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=max(config.num_iteration, config.warmup_steps + 1),
        end_value=config.learning_rate * config.min_lr_ratio,
    )


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
