"""The lines a run prints before step 1: model, devices and mesh, batch, data."""

import jax

from jaxtrain.models.lora import describe as describe_lora
from jaxtrain.parallel import mesh as mesh_lib
from jaxtrain.parallel import sharding


def run_banner(config, parts, stream, weights: str) -> list[str]:
    """`weights`: where the parameters come from (the model setup's source, or the
    checkpoint a resume restored)."""
    model_config, geometry, devices = parts.setup.model_config, parts.geometry, parts.devices
    setup = parts.setup
    lora = [] if setup.lora is None else [describe_lora(setup.lora, setup.lora_params, model_config.num_parameters)]
    return [
        f'model: {config.model_family} {model_config} | {model_config.num_parameters:,} parameters | '
        f'weights: {weights}',
        f'devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}) in '
        f'{jax.process_count()} process(es) | mesh {mesh_lib.describe(parts.mesh)} | '
        f'{sharding.describe_sharded(parts.param_shardings)} | dtype {config.dtype} | '
        f'attention {setup.attention} | cross-entropy {parts.cross_entropy}',
        f'batch: {geometry.batch_size} x {geometry.sequence_length} x DP {geometry.data_parallel} '
        f'(data x fsdp) x accumulation {geometry.accumulation} = {geometry.tokens_per_step} tokens/step',
        stream.describe(),  # 'train data: ...'
    ] + lora
