"""The trainer's `--help`: every flag once, under its topic, with its help text unchanged.

absl's own --help lists the flags in one alphabetical list, InfiniTrain's names and the two
learning-rate systems interleaved with the keys. `--helpfull` still prints that list (and absl's
own flags). A key new to config/keys.py goes to its topic by one line in TOPICS below; until then
it is listed under "other", never left out.

The --help line of a config key: its meaning, its default, and the shipped configs'
own value where they set another (configs/gpt2.py makes the model `small`, LLaMA-3's its
learning rate 1e-2 ...), so `--help` / `--helpfull` show what a run would use.

The flags themselves default to None (flags.py: "not given" must stay distinguishable
from "given the default"), which is why absl would show no default of its own.
"""

from __future__ import annotations

from absl import flags
import importlib.util
from functools import lru_cache

from jaxtrain.config.keys import shipped_config


# (heading, flags in the order shown). A flag named here that this program does not define is skipped.
TOPICS = (
    ('config file', ('config', 'verbose')),
    (
        'model',
        (
            'model',
            'tie_embeddings',
            'llmc_filepath',
            'init_from',
            'llmc_ffn_dim_multiplier',
            'llmc_norm_eps',
            'dtype',
            'seed',
            'scan_layers',
            'activation_recompute',
            'recompute_granularity',
            'recompute_method',
            'recompute_num_layers',
            'attention',
            'cross_entropy',
            'fused_kernels',
        ),
    ),
    (
        'LoRA',
        (
            'lora_rank',
            'lora_alpha',
            'lora_target_modules',
            'lora_save_path',
            'lora_save_layout',
            'lora_load_path',
        ),
    ),
    (
        'data',
        (
            'input_bin',
            'input_val_bin',
            'shuffle',
            'batch_size',
            'sequence_length',
            'total_batch_size',
            'val_loss_every',
            'val_max_steps',
            'overfit_single_batch',
            'accept_changed_data',
            'llmc_require_master_weights',
        ),
    ),
    ('text samples', ('sample_every', 'freq_generate_txt', 'text_length', 'tokenizer', 'tokenizer_bin')),
    (
        'optimizer and schedule',
        (
            'num_iteration',
            'optimizer',
            'learning_rate',
            'lr_schedule',
            'warmup_steps',
            'min_lr_ratio',
            'beta1',
            'beta2',
            'eps',
            'weight_decay',
            'grad_clip',
        ),
    ),
    (
        "InfiniTrain's schedule (PR 151), instead of lr_schedule / warmup_steps / min_lr_ratio",
        ('lr_decay_style', 'lr_warmup_iters', 'lr_warmup_init', 'min_lr', 'lr_decay_iters'),
    ),
    (
        'checkpoints',
        (
            'checkpoint_dir',
            'save_steps',
            'save_every_minutes',
            'max_checkpoint_keep',
            'keep_every_steps',
            'keep_best',
            'save_optimizer_state',
            'checkpoint_format',
            'resume_from',
            'overwrite_later_checkpoints',
        ),
    ),
    (
        'parallelism and devices',
        (
            'device',
            'num_devices',
            'mesh_data',
            'mesh_fsdp',
            'mesh_tensor',
            'zero_stage',
            'pipeline_parallel',
            'virtual_pipeline_parallel',
            'sequence_parallel',
            'context_parallel',
            'cp_comm_type',
            'deterministic',
            'coordinator_address',
            'num_processes',
            'process_id',
        ),
    ),
    (
        'logging and profiling',
        (
            'metrics_dir',
            'tensorboard_dir',
            'wandb_project',
            'peak_tflops',
            'trace_steps',
            'trace_dir',
            'precision_check',
        ),
    ),
)
INFINITRAIN_HEADING = "InfiniTrain's names for the keys above (its commands run unchanged)"
OTHER_HEADING = 'other'
_HELP_SPELLINGS = {f'{dashes}{name}' for dashes in ('-', '--') for name in ('help', 'helpshort', '?', 'h')}


def asks_for_topic_help(argv: list[str]) -> bool:
    """--help, -h, -? or --helpshort (not --helpfull, which absl answers with its full list)."""
    return bool(_HELP_SPELLINGS.intersection(argv[1:]))


def _flag_lines(flag) -> str:
    name = f'[no]{flag.name}' if isinstance(flag, flags.BooleanFlag) else flag.name
    text = flag.help
    if flag.default is not None and '(default:' not in text:
        text += f' (default: {flag.default_as_str})'
    return flags.text_wrap(f'--{name}: {text}', length=100, indent='    ', firstline_indent='  ')


def topic_help(doc: str, key_module: str, infinitrain_module: str) -> str:
    """`doc`, then each topic's flags, InfiniTrain's names, and any flag of the two modules (or of
    main's own) that no topic names."""
    by_module = flags.FLAGS.flags_by_module_dict()
    infinitrain = sorted({f.name for f in by_module.get(infinitrain_module, [])})
    own = {
        f.name for module in (key_module, infinitrain_module, '__main__') for f in by_module.get(module, [])
    }
    own |= {name for _, names in TOPICS for name in names if name in flags.FLAGS}
    sections, placed = [], set(infinitrain)
    for heading, names in TOPICS:
        names = [name for name in names if name in flags.FLAGS and name not in placed]
        placed.update(names)
        sections.append((heading, names))
    sections.append((INFINITRAIN_HEADING, infinitrain))
    sections.append((OTHER_HEADING, sorted(own - placed)))
    lines = [doc.strip(), '']
    for heading, names in sections:
        if names:
            lines += [f'{heading}:', *(_flag_lines(flags.FLAGS[name]) for name in names), '']
    lines.append("--helpfull: the same flags in one alphabetical list, with absl's own (--verbosity, ...).")
    return '\n'.join(lines)


SHIPPED = ('gpt2', 'llama3')


def _shown(value) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return repr(value) if isinstance(value, str) else str(value)


@lru_cache(maxsize=1)
def shipped_configs() -> dict:
    """{family: its config dict} of configs/*.py (empty where configs/ is not installed)."""
    configs = {}
    for family in SHIPPED:
        path = shipped_config(f'{family}.py')
        if path is None:
            continue
        spec = importlib.util.spec_from_file_location(f'_jaxtrain_help_config_{family}', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        configs[family] = module.get_config('').to_dict()
    return configs


def help_with_default(key: str, text: str, default) -> str:
    """'TEXT (default: D; configs/llama3.py: V)'."""
    overrides = [
        f'configs/{family}.py: {_shown(config[key])}'
        for family, config in shipped_configs().items()
        if key in config and config[key] != default and key != 'model_family'
    ]
    return f"{text} (default: {'; '.join([_shown(default), *overrides])})"
