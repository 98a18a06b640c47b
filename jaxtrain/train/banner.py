"""The lines a run prints before step 1: model, devices and mesh, batch, optimizer and schedule,
data; and the same facts as one JSON record (run_record) for config.json beside metrics.jsonl."""

import dataclasses

import jax

from jaxtrain.models.lora import describe as describe_lora
from jaxtrain.parallel import mesh as mesh_lib
from jaxtrain.parallel import sharding
from jaxtrain.optim.optimizer import INFINITRAIN_SCHEDULE_KEYS, schedule_spec


def run_banner(config, parts, stream, weights: str) -> list[str]:
    """`weights`: where the parameters come from (the model setup's source, or the
    checkpoint a resume restored)."""
    model_config, geometry, devices = parts.setup.model_config, parts.geometry, parts.devices
    setup = parts.setup
    lora = (
        []
        if setup.lora is None
        else [describe_lora(setup.lora, setup.lora_params, model_config.num_parameters)]
    )
    return [
        f'model: {config.model_family} {model_config} | {model_config.num_parameters:,} parameters | '
        f'weights: {weights}',
        f'devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}) in '
        f'{jax.process_count()} process(es) | mesh {mesh_lib.describe(parts.mesh)} | '
        f'{sharding.describe_sharded(parts.param_shardings)} | dtype {config.dtype} | '
        f'attention {setup.attention} | cross-entropy {parts.cross_entropy}',
        f'batch: {geometry.describe()}',
        optimizer_line(config),
        stream.describe(),  # 'train data: ...'
    ] + lora


def optimizer_line(config) -> str:
    """'optimizer: adamw | lr 1.00e-04, constant | β1 0.9, β2 0.95, eps 1e-08 | weight decay 0.1 ...'"""
    parts = [f'optimizer: {config.optimizer}', f'lr {config.learning_rate:.2e}, {schedule_text(config)}']
    if config.optimizer in ('adamw', 'adam'):
        parts.append(f'β1 {config.beta1:g}, β2 {config.beta2:g}, eps {config.eps:g}')
    if config.optimizer == 'adamw':  # optimizer.decay_mask: llm.c's rule
        parts.append(f'weight decay {config.weight_decay:g} (tensors of 2+ dimensions)')
    else:
        parts.append('no weight decay')
    parts.append(f'grad clip {config.grad_clip:g}' if config.grad_clip > 0 else 'no grad clip')
    return ' | '.join(parts)


def schedule_text(config) -> str:
    """The schedule in the spelling the run used: jaxtrain's keys, or InfiniTrain's (optim.schedule_spec)."""
    theirs = any(config.get(key, default) != default for key, default in INFINITRAIN_SCHEDULE_KEYS.items())
    if theirs:
        spec = schedule_spec(config)
        text = f"InfiniTrain's {spec.style}"
        if spec.warmup_iters:
            text += f', warmup {spec.warmup_iters} steps from {spec.warmup_init:.2e}'
        if spec.style in ('linear', 'cosine'):
            text += f' to min_lr {spec.min_lr:.2e} at step {spec.decay_iters}'
        return text
    text = config.lr_schedule
    if config.warmup_steps:
        text += f", after llm.c's linear warmup of {config.warmup_steps} steps"
    if config.lr_schedule == 'cosine':
        text += f' to {config.min_lr_ratio:g} x lr at step {config.num_iteration}'
    return text


def run_record(config, parts, weights: str) -> dict:
    """The whole resolved run (every key after flags, the model the weights fit, the batch), as
    written to config.json: a run that saves no checkpoint still records what it was."""
    setup, geometry, devices = parts.setup, parts.geometry, parts.devices
    return {
        'config': config.to_dict(),
        'model_family': config.model_family,
        'model_config': dataclasses.asdict(setup.model_config),
        'num_parameters': setup.model_config.num_parameters,
        'weights': weights,
        'batch': {**dataclasses.asdict(geometry), 'tokens_per_step': geometry.tokens_per_step},
        'optimizer': optimizer_line(config).removeprefix('optimizer: '),
        'devices': {'count': len(devices), 'platform': devices[0].platform, 'kind': devices[0].device_kind},
        'process_count': jax.process_count(),
    }
