"""Whether a config fits the devices and the model it names: the mesh, the batch geometry,
the model's shape and the pipeline schedule. check_config runs this after the keys'
own checks, before anything is created or built, so a run that does not fit changes
nothing. It reads the device count and the llm.c file's header only."""

import os

from jaxtrain.data.stream import batch_geometry
from jaxtrain.data.stream import total_on_mesh
from jaxtrain.config.flags import _given_on_command_line
from jaxtrain.models import FAMILIES
from jaxtrain.models.setup import hf_init_config, model_config_for
from jaxtrain.parallel import sharding


def _shape_words(model_config) -> str:
    words = (
        f'{model_config.num_layers} layers, {model_config.channels} channels, {model_config.num_heads} heads'
    )
    if hasattr(model_config, 'num_kv_heads'):
        words += f' ({model_config.num_kv_heads} key/value), FFN {model_config.ffn_hidden_dim}'
        words += ', tied head' if model_config.tie_embeddings else ''
    return words + f', vocabulary {model_config.vocab_size}'


def check_model_flag(config) -> None:
    """A --model given beside an --init_from Hugging Face folder (whose config.json sets the
    model) must name the same shape; one line naming both otherwise. --tie_embeddings applies to
    a named --model only: an llm.c LLaMA file's head is untied, and a folder's config.json says."""
    from_folder = hf_init_config(config)
    if config.model_family == 'llama3' and config.get('tie_embeddings'):
        untied = 'an llm.c LLaMA file (untied head)' if config.llmc_filepath else ''
        if from_folder is not None and not from_folder.tie_embeddings:
            untied = f'--init_from {config.init_from}, whose config.json has tie_word_embeddings false'
        if untied:
            raise ValueError(f'tie_embeddings: expected a named --model to tie, found {untied}; drop it')
    if from_folder is None or not _given_on_command_line('model'):
        return
    named = FAMILIES[config.model_family][2].get(config.model)
    if named is None or _shape_words(named) != _shape_words(from_folder):
        found = f'{_shape_words(named)}' if named else 'no such variant'
        raise ValueError(
            f'model: --model {config.model} ({found}) contradicts --init_from {config.init_from}, whose '
            f'config.json sets the model ({_shape_words(from_folder)}); drop --model'
        )


def check_fit(config) -> None:
    """Raises ValueError, one line naming the key, for the first thing that does not fit."""
    devices = sharding.select_devices(config.num_devices)
    sizes = sharding.mesh_sizes(config, len(devices))
    data_parallel = sizes['data'] * sizes['fsdp']
    geometry = batch_geometry(
        config.batch_size,
        config.sequence_length,
        total_on_mesh(config, data_parallel),
        data_parallel=data_parallel,
        context=sizes[sharding.CONTEXT],
    )
    model_config = model_config_for(config)
    check_model_flag(config)
    if config.fused_kernels != 'none':
        check_fused_kernels(config, devices)
    context = sizes[sharding.CONTEXT]
    if context > 1:
        check_context(config, context, model_config)
    if config.sequence_parallel and (config.sequence_length // context) % sizes['tensor']:
        times = f' × context_parallel {context}' if context > 1 else ''
        raise ValueError(
            f"sequence_length: expected a multiple of the tensor size {sizes['tensor']}{times} with "
            f'sequence_parallel, found {config.sequence_length}; pass a --sequence_length that '
            f"{sizes['tensor'] * context} divides, or a smaller --mesh_tensor"
        )
    if config.sequence_length > model_config.max_seq_len:
        raise ValueError(
            f'sequence_length: expected at most the model max_seq_len {model_config.max_seq_len}, '
            f'found {config.sequence_length}; pass --sequence_length {model_config.max_seq_len} or less'
        )
    stages = sizes[sharding.PIPELINE]
    if stages > 1:  # the pipeline's schedule (train/pipeline.py) has none of these yet
        combined = [
            flag
            for flag, on in (
                ('--lora_rank', config.lora_rank > 0),
                ('--zero_stage', config.zero_stage > 0),
                ('--sequence_parallel', config.sequence_parallel),
                ('--precision_check', bool(config.precision_check)),
            )
            if on
        ]
        if combined:
            raise ValueError(
                f"pipeline_parallel {stages} with {', '.join(combined)}: not supported yet "
                '(the pipeline schedule, train/pipeline.py, does not combine with them); drop one'
            )
    check_pipeline(
        model_config.num_layers, stages, config.get('virtual_pipeline_parallel', 1), geometry.accumulation
    )


def check_context(config, context: int, model_config) -> None:
    """--context_parallel C (parallel/context_parallel.py): C slices of T, and for a2a C
    divides the heads."""
    if config.sequence_length % context:
        raise ValueError(
            f'sequence_length: expected a multiple of context_parallel {context} (each slice as long), '
            f'found {config.sequence_length}; pass a --sequence_length that {context} divides'
        )
    if config.cp_comm_type == 'a2a':
        heads = {'num_heads': model_config.num_heads}
        heads['num_kv_heads'] = getattr(model_config, 'num_kv_heads', model_config.num_heads)
        for name, count in heads.items():
            if count % context:
                raise ValueError(
                    f"cp_comm_type: a2a splits the heads over the context devices: expected the model's "
                    f'{name} {count} to be a multiple of context_parallel {context}; pass --cp_comm_type '
                    'all_gather or p2p, or a --context_parallel that divides it'
                )


# Lets a CPU run take --fused_kernels through Pallas' interpreter (slow): for tests of the loop.
INTERPRET_ENV = 'JAXTRAIN_PALLAS_INTERPRET'


def check_fused_kernels(config, devices) -> None:
    """--fused_kernels (models/layernorm_kernel.py, bias_gelu_kernel.py): GPT-2's, on one GPU."""
    chosen = f'--fused_kernels {config.fused_kernels}'
    if config.model_family != 'gpt2':
        raise ValueError(
            f"fused_kernels: expected none for {config.model_family} (the kernels are GPT-2's), found "
            f'{config.fused_kernels}; pass --fused_kernels none'
        )
    if len(devices) != 1:
        raise ValueError(
            f'fused_kernels: expected one device with {chosen} (XLA cannot split a Pallas call over a mesh), '
            f'found {len(devices)}; pass --num_devices 1 or --fused_kernels none'
        )
    if devices[0].platform != 'gpu' and os.environ.get(INTERPRET_ENV) != '1':
        raise ValueError(
            f'fused_kernels: expected a GPU with {chosen}, found {devices[0].platform!r}; pass '
            '--fused_kernels none'
        )
    if config.lora_rank > 0 and config.fused_kernels in ('bias_gelu', 'all'):
        raise ValueError(
            f'fused_kernels: expected --lora_rank 0 with {chosen} (the kernel takes the bias from a plain '
            f"c_fc), found lora_rank {config.lora_rank}; pass --fused_kernels layernorm or none"
        )
    if config.precision_check and config.fused_kernels in ('layernorm', 'all'):
        raise ValueError(
            f"fused_kernels: expected no --precision_check with {chosen} (the fused blocks have no 'Block' "
            'output to tap); pass --fused_kernels bias_gelu or none'
        )


def check_pipeline(num_layers: int, stages: int, virtual: int, microbatches: int) -> None:
    """Refuses a pipeline the schedule (train/pipeline.py) cannot run, in one line naming the flag."""
    if virtual < 1:
        raise ValueError(
            f'virtual_pipeline_parallel: expected a positive number of chunks, found {virtual}; '
            'pass 1 or more'
        )
    if stages == 1 and virtual > 1:
        raise ValueError(
            f'virtual_pipeline_parallel: expected 1 without pipeline stages (pipeline_parallel 1), found '
            f'{virtual}; set --pipeline_parallel too'
        )
    if stages == 1:
        return
    if num_layers % (stages * virtual):
        raise ValueError(
            f"pipeline_parallel × virtual_pipeline_parallel: expected a divisor of the model's {num_layers} "
            f'layers, found {stages} × {virtual} = {stages * virtual}; change either so each chunk gets '
            'the same number of layers'
        )
    if microbatches < stages:
        raise ValueError(
            f'total_batch_size: expected at least pipeline_parallel = {stages} microbatches (gradient '
            f'accumulation steps = total_batch_size / (batch_size × sequence_length × data parallel)), found '
            f'{microbatches}; raise --total_batch_size or lower --batch_size'
        )
