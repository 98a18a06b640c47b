"""InfiniTrain's command-line flags, every one: what each means here.

InfiniTrain's `gpt2` and `llama3` examples (example/{gpt2,llama3}/main.cc) define 34 gflags at
InfiniTensor/InfiniTrain b24d92f280dd5f46d6c0eee97230d9fcffc70785 (HEAD), and the checkpoint
generation before it used five more names: `--checkpoint_dir --save_steps --resume_from
--checkpoint_format` (f9cb65b5408a90db2d88658609cabf58a2ca7539, an ancestor of HEAD) and
`--use_llmc_checkpoint_io` (b8e9dd2f7a9cf692deb1b700b1796a99144bc3c0, the checkpoint PR branch).
PR 151 (a7949ac0f46fb3de64520a18bc13ebc70b6bc158, LR schedulers, merged upstream later) adds five:
`--min_lr --lr_decay_style --lr_warmup_iters --lr_warmup_init --lr_decay_iters`; PR 154
(e594d9c, activation recompute) four: `--activation_recompute --recompute_granularity
--recompute_method --recompute_num_layers`; PR 181 (feat/context_parallel d03ba16, context
parallelism) two: `--context_parallel --cp_comm_type`; and older builds of the checkpoint
branch (c82cbe8) spelled `--save_optimizer_state false` as `--no_save_optim true`.
UPSTREAM below is that list of 51, each with its upstream type and defaults and how jaxtrain
takes it:

  key       a config key of the same name (keys.py); flags.py defines its flag
  renamed   sets another config key: `--save DIR` is `--checkpoint_dir DIR`
  later     accepted; its upstream default runs, any other value is refused on one line
            ("not supported yet"), because jaxtrain has not built that feature yet

A name that turns into a config key later (say `lora_rank` when LoRA lands) is taken over by
that key automatically: only the names that are not config keys get a flag here.
"""

import dataclasses

from absl import flags

from jaxtrain.config.keys import KEYS

HEAD_COMMIT = 'b24d92f280dd5f46d6c0eee97230d9fcffc70785'
PR_COMMIT = 'f9cb65b5408a90db2d88658609cabf58a2ca7539'  # --checkpoint_dir/--save_steps/...
LLMC_IO_COMMIT = 'b8e9dd2f7a9cf692deb1b700b1796a99144bc3c0'  # --use_llmc_checkpoint_io
LR_SCHEDULER_COMMIT = 'a7949ac0f46fb3de64520a18bc13ebc70b6bc158'  # --lr_decay_style and four more


@dataclasses.dataclass(frozen=True)
class UpstreamFlag:
    name: str
    kind: str  # bool | int | float | string, as upstream defines it
    gpt2_default: object
    llama3_default: object
    handling: str  # key | renamed | later
    target: str = ''  # renamed: the config key; later: what builds it
    help: str = ''

    def default(self, family: str):
        return self.llama3_default if family == 'llama3' else self.gpt2_default


def _same(name, kind, default, handling='key', target='', help='', llama3=None):
    return UpstreamFlag(name, kind, default, default if llama3 is None else llama3, handling, target, help)


_TEXT = 'text generation'
UPSTREAM = (
    # I/O
    _same('input_bin', 'string', ''),
    _same('input_val_bin', 'string', ''),
    _same('tokenizer_bin', 'string', '', 'later', _TEXT, 'llm.c tokenizer file'),
    _same('llmc_filepath', 'string', ''),
    _same('model', 'string', 'gpt2', llama3='llama3'),
    # token layout and workload
    _same('batch_size', 'int', 4),
    _same('sequence_length', 'int', 64),
    _same('total_batch_size', 'int', 256),
    _same('num_iteration', 'int', 10),
    _same('freq_generate_txt', 'int', 10, 'later', _TEXT, 'generate text every N steps'),
    _same('text_length', 'int', 64, 'later', _TEXT, 'tokens of generated text'),
    # optimization
    _same('learning_rate', 'float', 1e-4, llama3=1e-5),
    _same('zero_stage', 'int', 0),
    # evaluation
    _same('val_loss_every', 'int', 0),
    _same('sample_every', 'int', 0, 'later', _TEXT, 'sample from the model every N steps'),
    # debugging, device
    _same('overfit_single_batch', 'bool', True),
    _same('device', 'string', 'cuda'),
    # parallelism
    _same(
        'nthread_per_process',
        'int',
        1,
        'renamed',
        'num_devices',
        'devices this process trains on (data parallel over what tensor_parallel leaves)',
    ),
    _same('tensor_parallel', 'int', 1, 'renamed', 'mesh_tensor', 'tensor-parallel size (mesh tensor axis)'),
    _same('sequence_parallel', 'bool', False),
    _same('pipeline_parallel', 'int', 1, 'later', 'pipeline parallelism', 'pipeline stages'),
    _same(
        'virtual_pipeline_parallel',
        'int',
        1,
        'later',
        'pipeline parallelism',
        'model chunks per pipeline stage',
    ),
    # precision, checkpoints (HEAD names)
    _same('dtype', 'string', 'float32'),
    _same('save_interval', 'int', 0, 'renamed', 'save_steps', 'save every N steps (= --save_steps)'),
    _same('load', 'string', '', 'renamed', 'resume_from', 'checkpoint directory to resume (= --resume_from)'),
    _same('save', 'string', '', 'renamed', 'checkpoint_dir', 'root of the checkpoints (= --checkpoint_dir)'),
    _same('max_checkpoint_keep', 'int', 3),
    _same('save_optimizer_state', 'bool', True),
    _same('precision_check', 'string', ''),
    # LoRA
    _same('lora_rank', 'int', 0, 'later', 'LoRA', 'LoRA rank (0 = off)'),
    _same('lora_alpha', 'float', 16.0, 'later', 'LoRA', 'LoRA alpha'),
    _same(
        'lora_target_modules',
        'string',
        'c_attn,c_proj',
        'later',
        'LoRA',
        'modules LoRA wraps',
        llama3='c_attn,c_proj,c_fc,c_fc2',
    ),
    _same('lora_save_path', 'string', '', 'later', 'LoRA', 'where to save the LoRA weights'),
    _same('lora_load_path', 'string', '', 'later', 'LoRA', 'LoRA weights to start from'),
    # the checkpoint generation before HEAD
    _same('checkpoint_dir', 'string', './checkpoints'),
    _same('save_steps', 'int', 0),
    _same('resume_from', 'string', ''),
    _same('checkpoint_format', 'string', 'pth'),
    _same(
        'use_llmc_checkpoint_io',
        'bool',
        False,
        'renamed',
        'checkpoint_format',
        'GPT-2: write the llm.c model.bin format (= --checkpoint_format infinitrain-bin)',
    ),
    # PR 151's LR schedulers (example/{gpt2,llama3}/main.cc at a7949ac0)
    _same('min_lr', 'float', 0.0),
    _same('lr_decay_style', 'string', 'constant'),
    _same('lr_warmup_iters', 'int', 0),
    _same('lr_warmup_init', 'float', 0.0),
    _same('lr_decay_iters', 'int', 0),
    # PR 154's activation recompute (feat/activation_checkpointing e594d9c example/gpt2/main.cc:82-86)
    _same('activation_recompute', 'bool', False),
    _same('recompute_granularity', 'string', 'full'),
    _same('recompute_method', 'string', 'none'),
    _same('recompute_num_layers', 'int', 0),
    # the checkpoint branch before f9cb65b5 (c82cbe8 example/gpt2/main.cc): true = no optimizer file
    _same(
        'no_save_optim',
        'bool',
        False,
        'renamed',
        'save_optimizer_state',
        'older builds: true keeps the optimizer state out of checkpoints (= --save_optimizer_state false)',
    ),
    # PR 181's context parallelism (feat/context_parallel d03ba16 example/gpt2/main.cc:82-83)
    _same('context_parallel', 'int', 1),
    _same('cp_comm_type', 'string', 'p2p'),
)
BY_NAME = {flag.name: flag for flag in UPSTREAM}

# InfiniTrain's --checkpoint_format spellings -> ours (f9cb65b: 'pth' writes CKPT state
# dicts, 'bin' the llm.c model.bin; HEAD writes CKPT files named model.ckpt).
CHECKPOINT_FORMAT_ALIASES = {'pth': 'infinitrain', 'ckpt': 'infinitrain', 'bin': 'infinitrain-bin'}

_TRUE, _FALSE = ('true', '1', 'yes', 'on'), ('false', '0', 'no', 'off')


class FlagError(ValueError):
    """An InfiniTrain flag this run cannot take; the message is one line."""


def _config_keys() -> set:
    return {key for key, _, _ in KEYS}


def alias_names() -> list[str]:
    """The upstream names that are not config keys: this module defines their flags."""
    keys = _config_keys()
    return [flag.name for flag in UPSTREAM if flag.name not in keys]


def boolean_names() -> list[str]:
    return [name for name in alias_names() if BY_NAME[name].kind == 'bool']


def define_flags() -> list[str]:
    """Defines a flag for every upstream name that is not a config key. Booleans are string
    flags that flags.py normalises (bare, --noX and --X true|false all work)."""
    defined = []
    for name in alias_names():
        flag = BY_NAME[name]
        if name in flags.FLAGS:
            continue
        text = f'InfiniTrain --{name}: {flag.help}'
        if flag.handling == 'later':
            text += f' [not supported yet: {flag.target}; only upstream\'s default runs]'
        if flag.kind == 'bool':
            flags.DEFINE_string(name, None, text + ' [true|false]')
        elif flag.kind == 'int':
            flags.DEFINE_integer(name, None, text)
        elif flag.kind == 'float':
            flags.DEFINE_float(name, None, text)
        else:
            flags.DEFINE_string(name, None, text)
        defined.append(name)
    return defined


def _value(name: str):
    flag = flags.FLAGS[name]
    if BY_NAME[name].kind != 'bool':
        return flag.value
    text = str(flag.value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise FlagError(f'--{name}: expected true or false, found {flag.value!r}')


def canonical_checkpoint_format(value: str) -> str:
    return CHECKPOINT_FORMAT_ALIASES.get(value, value)


def apply(config, defined: list[str]) -> None:
    """Copies the upstream flags the user gave onto `config`, or raises FlagError for one
    this run cannot honour. Runs after the plain key flags, so `--save DIR` wins over a
    config file's checkpoint_dir."""
    given = {name: _value(name) for name in defined if flags.FLAGS[name].present}
    for name, value in given.items():
        flag = BY_NAME[name]
        if flag.handling == 'later':
            if value != flag.default(config.model_family):
                raise FlagError(
                    f'--{name} {value}: not supported yet (it comes with {flag.target}); leave it out '
                    f'or at {flag.default(config.model_family)!r}'
                )
            continue
        target_flag = flags.FLAGS[flag.target] if flag.target in flags.FLAGS else None
        if name == 'use_llmc_checkpoint_io':
            if value:
                config.checkpoint_format = 'infinitrain-bin'
            continue
        if name == 'no_save_optim':  # the inverse of the name that replaced it
            value = not value
        if target_flag is not None and target_flag.present and target_flag.value != value:
            raise FlagError(
                f'--{name} {value} and --{flag.target} {target_flag.value}: expected one of them '
                f'(--{name} is InfiniTrain\'s name for --{flag.target})'
            )
        config[flag.target] = value
    config.checkpoint_format = canonical_checkpoint_format(config.checkpoint_format)
    if 'nthread_per_process' in given:
        # InfiniTrain: DP = nthread_per_process / (tensor_parallel x pipeline_parallel).
        config.mesh_data, config.mesh_fsdp = -1, 1
    # InfiniTrain's own rule (example/gpt2/main.cc at HEAD): --save and --save_interval
    # come together.
    if 'save' in given or 'save_interval' in given:
        if config.checkpoint_dir and not config.save_steps:
            raise FlagError(
                f"--save {config.checkpoint_dir!r}: expected --save_interval N > 0 with it, found 0; "
                'they must be set together'
            )
        if config.save_steps and not config.checkpoint_dir:
            raise FlagError(
                f'--save_interval {config.save_steps}: expected --save DIR with it, found none; '
                'they must be set together'
            )
