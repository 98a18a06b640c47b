"""Which model to train and where its first weights come from.

Order: an llm.c file (`llmc_filepath`: its header sets the shape, its tensors the
weights), else the named variant with llm.c's random init. (A checkpoint resume
replaces these weights later; see checkpoint/resume.py.)
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.parallel import platform
from jaxtrain.models import FAMILIES
from jaxtrain.models.attention import resolve_attention
from jaxtrain.models.lora import attach_lora
from jaxtrain.models.layer_stack import Recompute

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass
class ModelSetup:
    family: str
    model_config: object  # GPT2Config | LLaMA3Config
    graphdef: nnx.GraphDef
    params: dict  # pure nested dict of arrays
    source: str  # where the weights came from, for the start-up log
    llmc_file: str = ''
    lora: object = None  # lora.LoRASpec when lora_rank > 0 (graphdef then holds the adapters)
    lora_params: dict | None = None  # the adapters' pure dict (lora.py); params stay the frozen base
    attention: str = ''  # the kernel resolve_attention picked, for the start-up log


def config_from_header(config_cls, header):
    """The model config of an llmc_io header: the two share their field names."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    return config_cls(**{k: v for k, v in dataclasses.asdict(header).items() if k in fields})


def _load_llmc(config):
    import llmc_io  # pure NumPy; imported here so the trainer starts without it when unused

    overrides = {}
    if config.llmc_ffn_dim_multiplier:
        overrides['ffn_dim_multiplier'] = config.llmc_ffn_dim_multiplier
    if config.llmc_norm_eps:
        overrides['norm_eps'] = config.llmc_norm_eps
    loader = {'gpt2': llmc_io.load_gpt2, 'llama3': llmc_io.load_llama3}[config.model_family]
    if config.model_family == 'llama3':
        return loader(config.llmc_filepath, **overrides)
    return loader(config.llmc_filepath)


def shape_mismatches(expected: dict, found: dict, prefix=''):
    problems = []
    for key in sorted(set(expected) | set(found)):
        name = f'{prefix}{key}'
        if key not in found:
            problems.append(f'{name}: missing')
        elif key not in expected:
            problems.append(f'{name}: unexpected')
        elif isinstance(expected[key], dict):
            problems += shape_mismatches(expected[key], found[key], name + '/')
        elif tuple(expected[key].shape) != tuple(np.shape(found[key])):
            problems.append(
                f'{name}: expected shape {tuple(expected[key].shape)}, found {tuple(np.shape(found[key]))}'
            )
    return problems


def hf_init_config(config):
    """The model config.json of an --init_from Hugging Face folder describes (its tensors
    unread), or None when --init_from names no such folder."""
    from llmc_io.gpt2 import GPT2Header
    from llmc_io.hf import is_hf_folder
    from llmc_io.hf.config import hf_header

    if not config.init_from or not is_hf_folder(config.init_from):
        return None
    header = hf_header(config.init_from)
    family = 'gpt2' if isinstance(header, GPT2Header) else 'llama3'
    if family != config.model_family:
        raise ValueError(
            f'init_from: {config.init_from}: expected {config.model_family} weights (the config file\'s '
            f'family), found a {family} Hugging Face folder; train it with configs/{family}.py'
        )
    return config_from_header(FAMILIES[family][1], header)


def model_config_for(config):
    """The model's shape: the llm.c file's header (its tensors unread), an --init_from Hugging
    Face folder's config.json, else the named variant of the family."""
    _, config_cls, variants = FAMILIES[config.model_family]
    from_folder = hf_init_config(config)
    if from_folder is not None:
        return from_folder
    if config.llmc_filepath:  # the family's own reader, as _load_llmc: its errors name the family
        from llmc_io.gpt2 import gpt2_info
        from llmc_io.llama3 import llama3_info

        if config.model_family == 'gpt2':
            info = gpt2_info(config.llmc_filepath)
        else:
            info = llama3_info(
                config.llmc_filepath,
                ffn_dim_multiplier=config.llmc_ffn_dim_multiplier or None,
                norm_eps=config.llmc_norm_eps or None,
            )
        return config_from_header(config_cls, info.header)
    if config.model not in variants:
        raise ValueError(
            f"model: expected one of {', '.join(sorted(variants))} for {config.model_family}; "
            f'found {config.model!r}'
        )
    if config.model_family == 'llama3' and config.get('tie_embeddings'):
        return dataclasses.replace(variants[config.model], tie_embeddings=True)
    return variants[config.model]


def random_init_params(family: str, model_config, seed: int, **options) -> dict:
    """The random init of `seed` as a pure dict: a run's, and the base a LoRA checkpoint
    trained on a random init rebuilds (checkpoint/resume_checks.py)."""
    model_cls = FAMILIES[family][0]
    init = jax.jit(lambda: nnx.split(model_cls(model_config, **options, rngs=nnx.Rngs(seed)), nnx.Param)[1])
    return nnx.to_pure_dict(init())


def setup_model(config) -> ModelSetup:
    model_cls, config_cls, variants = FAMILIES[config.model_family]
    dtype = DTYPES[config.dtype]
    deterministic = platform.deterministic_in_effect()
    attention = resolve_attention(
        config.attention,
        dtype,
        deterministic=deterministic,
        scan_layers=config.scan_layers,
        seq_len=config.sequence_length,
        num_devices=config.num_devices or jax.device_count(),
    )
    options = dict(
        dtype=dtype,
        attention=attention,
        scan_layers=config.scan_layers,
        recompute=Recompute.from_config(config),
        # Only a GPU's scatter-add is nondeterministic. Elsewhere the same op in both modes
        # keeps a run with checkpoints bitwise equal to one without (deterministic is 'auto').
        deterministic=deterministic and jax.default_backend() == 'gpu',
    )
    if config.model_family == 'gpt2':  # LLaMA-3 has no fused kernels (checks/fit_checks.py)
        options['fused_kernels'] = config.fused_kernels

    if config.llmc_filepath:
        header, file_params = _load_llmc(config)
        model_config = config_from_header(config_cls, header)
        abstract = nnx.eval_shape(lambda: model_cls(model_config, **options, rngs=nnx.Rngs(0)))
        graphdef, abstract_params = nnx.split(abstract, nnx.Param)
        expected = nnx.to_pure_dict(abstract_params)
        problems = shape_mismatches(expected, file_params)
        if problems:
            raise ValueError(
                f'{config.llmc_filepath}: tensors do not fit the model built from its header: '
                + '; '.join(problems)
            )
        # On the host: put_global splits each tensor there for its devices. A device array here
        # would be sliced on device 0 instead, by one compiled program per shape and sharding.
        params = jax.tree.map(lambda a: np.asarray(a, np.float32), file_params)
        setup = ModelSetup(
            config.model_family,
            model_config,
            graphdef,
            params,
            f'llm.c file {config.llmc_filepath}',
            config.llmc_filepath,
            attention=attention,
        )
        return attach_lora(config, setup, model_cls, options)

    model_config = model_config_for(config)
    graphdef, abstract_params = nnx.split(
        nnx.eval_shape(lambda: model_cls(model_config, **options, rngs=nnx.Rngs(0))),
        nnx.Param,
    )
    if config.init_from:  # its weights replace these (checkpoint/resume.py): shapes only
        setup = ModelSetup(
            config.model_family,
            model_config,
            graphdef,
            nnx.to_pure_dict(abstract_params),
            '',
            attention=attention,
        )
        return attach_lora(config, setup, model_cls, options)
    params = random_init_params(config.model_family, model_config, config.seed, **options)
    source = f'random init (seed {config.seed})'
    setup = ModelSetup(config.model_family, model_config, graphdef, params, source, attention=attention)
    return attach_lora(config, setup, model_cls, options)
