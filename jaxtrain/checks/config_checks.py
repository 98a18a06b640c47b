"""Refuses a bad config before anything is built: one line naming the key, what was
expected and what was found. The one place a run's config is validated: the entry points
(main.py, the benchmark) call check_config once; train/ builds without checking again.

path_problems refuses paths of the wrong kind before anything runs: a checkpoint or metrics directory
that names a file (the run would train, then fail at its first save), data or a model file
that names a directory (a bare `[Errno 21]` otherwise). One line each: the key, what was
expected, what was found, what to do.
"""

import glob
import importlib.util
import math
import os
from pathlib import Path

from jaxtrain.checkpoint.registry import FORMAT_NAMES, WRITERS
from jaxtrain.checks.fit_checks import check_fit
from jaxtrain.parallel.context_parallel import COMM_TYPES as CP_COMM_TYPES
from llmc_io.infinitrain.lora_weights import LAYOUTS as LORA_LAYOUTS
from jaxtrain.models import vocab_table
from jaxtrain.models import layer_stack
from jaxtrain.models.attention import IMPLEMENTATIONS
from jaxtrain.models.gpt2 import FUSED_KERNELS
from jaxtrain.optim.infinitrain_lr_schedule import STYLES
from jaxtrain.optim.optimizer import OPTIMIZERS, SCHEDULES, schedule_spec, spelled_with_infinitrain_flags
from jaxtrain.train import step_trace
from jaxtrain.models import precision_check

CHOICES = {
    'model_family': ('gpt2', 'llama3'),
    'dtype': ('float32', 'bfloat16'),
    'optimizer': OPTIMIZERS,
    'lr_schedule': SCHEDULES,
    'lr_decay_style': STYLES,
    'attention': IMPLEMENTATIONS,
    'cross_entropy': vocab_table.IMPLEMENTATIONS,
    'fused_kernels': FUSED_KERNELS,
    'deterministic': ('auto', 'true', 'false'),
    'device': ('auto', 'cpu', 'cuda'),
    'checkpoint_format': FORMAT_NAMES,
    'shuffle': ('none', 'llmc'),
    'lora_save_layout': LORA_LAYOUTS,
    'cp_comm_type': CP_COMM_TYPES,
}
NON_NEGATIVE = (
    'num_devices',
    'num_processes',
    'num_iteration',
    'save_steps',
    'max_checkpoint_keep',
    'keep_every_steps',
    'keep_best',
    'save_every_minutes',
    'val_loss_every',
    'warmup_steps',
    'learning_rate',
    'weight_decay',
    'grad_clip',
    'llmc_ffn_dim_multiplier',
    'llmc_norm_eps',
    'total_batch_size',  # 0: one micro-step per rank (data/stream.py)
    'peak_tflops',
)
POSITIVE = ('batch_size', 'sequence_length', 'context_parallel')
MESH_AXES = ('mesh_data', 'mesh_fsdp', 'mesh_tensor')  # a size, or -1 to fill (parallel/sharding.py)


def _number_problems(config) -> list[str]:
    """NaN and infinity pass every comparison a range check makes (nan < 0 is False), and a
    seed outside int64 reaches JAX as an OverflowError: both are refused here, by name."""
    problems = []
    for key, value in config.items():
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f'{key}: expected a finite number, found {value}')
    seed = config.get('seed', 0)
    if isinstance(seed, int) and not -(2**63) <= seed < 2**63:
        problems.append(f'seed: expected an integer in [-2**63, 2**63), found {seed}')
    return problems


def _first_per_key(problems: list[str]) -> list[str]:
    """One problem per key (the first found): the checks overlap, e.g. a negative learning rate
    is below 0 and also wrong for a decay schedule, and one line should say it once."""
    seen, kept = set(), []
    for problem in problems:
        key = problem.split(':', 1)[0]
        if key not in seen:
            seen.add(key)
            kept.append(problem)
    return kept


def check_config(config):
    problems = _number_problems(config)
    for key, choices in CHOICES.items():
        if config[key] not in choices:
            problems.append(f"{key}: expected one of {', '.join(choices)}; found {config[key]!r}")
    for key in NON_NEGATIVE:
        if config[key] < 0:
            problems.append(f'{key}: expected a value >= 0, found {config[key]}')
    for key in POSITIVE:
        if config[key] <= 0:
            problems.append(f'{key}: expected a positive integer, found {config[key]}')
    for key in MESH_AXES:
        if config[key] == 0 or config[key] < -1:
            problems.append(f'{key}: expected a positive size or -1 (fill), found {config[key]}')
    problems += _range_problems(config)
    if config.process_id < -1:
        problems.append(
            f'process_id: expected a value >= 0, or -1 (from the environment), found {config.process_id}'
        )
    problems += layer_stack.check(config)
    if config.zero_stage not in (0, 1, 2, 3):
        problems.append(f'zero_stage: expected 0, 1, 2 or 3, found {config.zero_stage}')
    keep_every, save_steps = config.keep_every_steps, config.save_steps
    if keep_every and save_steps and keep_every % save_steps and not config.save_every_minutes:
        problems.append(
            f'keep_every_steps: expected a multiple of save_steps {config.save_steps}, found '
            f'{config.keep_every_steps}: only steps that are multiples of both would be kept. '
            f'Pass --keep_every_steps {save_steps * max(1, round(keep_every / save_steps))}'
        )
    if config.init_from and config.llmc_filepath:
        problems.append(
            f'init_from: expected one source of initial weights, found both --init_from {config.init_from} '
            f'and --llmc_filepath {config.llmc_filepath}; pass one'
        )
    if config.keep_best and not config.val_loss_every:
        problems.append(
            f'keep_best: expected --val_loss_every N > 0 (checkpoints are ranked by the validation loss at '
            f'their step), found val_loss_every 0; pass --val_loss_every {config.save_steps or 1}'
        )
    elif config.keep_best and config.save_steps and config.save_steps % config.val_loss_every:
        problems.append(
            f'keep_best: expected save_steps to be a multiple of val_loss_every {config.val_loss_every} (a '
            f'checkpoint is ranked by the validation loss at its step), found save_steps {config.save_steps}'
        )
    no_val_loss = getattr(WRITERS.get(config.checkpoint_format), 'no_val_loss', '')
    if config.keep_best and no_val_loss:
        problems.append(
            'keep_best: expected a checkpoint format whose steps record their validation loss, found '
            f'--checkpoint_format {config.checkpoint_format} ({no_val_loss}); drop --keep_best or save '
            'as orbax'
        )
    if config.wandb_project and importlib.util.find_spec('wandb') is None:
        problems.append(
            f"wandb_project: expected the wandb package to log to {config.wandb_project!r}, found it not "
            "installed; pip install wandb (or pip install 'jaxtrain[wandb]'), or drop --wandb_project"
        )
    if config.tokenizer and config.tokenizer_bin:
        problems.append(
            f'tokenizer: expected one of --tokenizer and --tokenizer_bin, found both ({config.tokenizer} and '
            f'{config.tokenizer_bin}); pass one'
        )
    if config.precision_check:
        try:
            precision_check.parse(config.precision_check)
        except ValueError as e:
            problems.append(str(e).removeprefix('--'))
    saving = config.save_steps > 0 or config.save_every_minutes > 0
    if saving and not config.checkpoint_dir:
        problems.append(
            'checkpoint_dir: expected a directory because save_steps/save_every_minutes is set; '
            'found none. Pass --checkpoint_dir DIR.'
        )
    problems += _trace_problems(config)
    problems += path_problems(config)
    if problems:
        raise ValueError('; '.join(_first_per_key(problems)))
    check_fit(config)  # the devices, the model file's header: only once the keys themselves are sound


def _range_problems(config) -> list[str]:
    """Values of the right type that still make no sense (a negative learning rate at the
    end of a cosine, an Adam average that never forgets, a validation of no batches)."""
    problems = []
    if not 0 <= config.min_lr_ratio <= 1:
        problems.append(
            f'min_lr_ratio: expected 0..1 (a fraction of learning_rate), found {config.min_lr_ratio}'
        )
    if config.lr_decay_style in STYLES:  # else CHOICES names it
        try:
            spec = schedule_spec(config)  # refuses both spellings at once
            if spelled_with_infinitrain_flags(config):
                spec.check()  # InfiniTrain's CreateLRScheduler CHECKs (ours has its own ranges)
        except ValueError as e:
            problems.append(str(e))
    for key in ('beta1', 'beta2'):
        if not 0 <= config[key] < 1:
            problems.append(f'{key}: expected 0 <= {key} < 1, found {config[key]}')
    if not config.eps > 0:
        problems.append(f'eps: expected a value > 0, found {config.eps}')
    if config.val_max_steps < 1:
        problems.append(
            f'val_max_steps: expected at least 1 batch per evaluation, found {config.val_max_steps}'
        )
    return problems


def _trace_problems(config) -> list[str]:
    if not config.trace_steps:
        if config.trace_dir:
            return [
                f'trace_steps: expected the steps to trace into --trace_dir {config.trace_dir}, found none; '
                'pass --trace_steps FIRST-LAST (e.g. 41-43)'
            ]
        return []
    problems = []
    try:
        _, last = step_trace.parse_steps(config.trace_steps)
        if last > config.num_iteration:
            problems.append(
                f'trace_steps: expected steps the run reaches (num_iteration {config.num_iteration}), found '
                f'{config.trace_steps}'
            )
    except ValueError as e:
        problems.append(str(e))
    if not config.trace_dir:
        problems.append(
            f'trace_dir: expected a directory for the trace of --trace_steps {config.trace_steps}; '
            'found none. Pass --trace_dir DIR.'
        )
    return problems


def deterministic_wanted(config) -> bool:
    """'auto' turns deterministic kernels on exactly when the run saves or resumes."""
    if config.deterministic != 'auto':
        return config.deterministic == 'true'
    return bool(config.checkpoint_dir and (config.save_steps or config.save_every_minutes)) or bool(
        config.resume_from
    )


# path_problems: keys naming a directory the run creates or fills.
DIRECTORY_KEYS = ('checkpoint_dir', 'metrics_dir', 'tensorboard_dir', 'trace_dir')
# Keys naming files: a glob of shards, or one file.
SHARD_GLOB_KEYS = ('input_bin', 'input_val_bin')
FILE_KEYS = ('llmc_filepath',)
# Keys naming a file the run writes at its end: checked now, or the run would train and then lose it.
OUTPUT_FILE_KEYS = ('lora_save_path',)


def _file_in_the_way(path: Path) -> Path | None:
    """The path itself or the nearest existing parent, when that is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def path_problems(config) -> list[str]:
    problems = []
    for key in DIRECTORY_KEYS:
        if not config[key]:
            continue
        blocker = _file_in_the_way(Path(config[key]).absolute())
        if blocker is not None:
            # The path first, as root_access.py's checks of the same key word it.
            problems.append(
                f'{key}: {config[key]}: expected a directory (or a path to create), found that {blocker} is '
                f'a file; pass a directory to --{key}'
            )
    for key in SHARD_GLOB_KEYS:
        pattern = config[key]
        if not pattern:
            continue
        named = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        directories = [p for p in named if os.path.isdir(p)]
        if directories:
            example = os.path.join(directories[0], '*.bin')
            problems.append(
                f"{key}: expected llm.c token shard files, found the directory {directories[0]}; pass a glob "
                f"of the shards in it, e.g. --{key} '{example}'"
            )
    for key in FILE_KEYS:
        if config[key] and os.path.isdir(config[key]):
            problems.append(f'{key}: expected an llm.c model file, found the directory {config[key]}')
    for key in OUTPUT_FILE_KEYS:
        if config.get(key):
            problems += _output_file_problems(key, Path(config[key]))
    return problems


def _output_file_problems(key: str, path: Path) -> list[str]:
    parent = path.absolute().parent
    if path.is_dir():
        problem = (
            f'{key}: {path}: expected a file to write, found a directory; name a file in it, e.g. '
            f'--{key} {path / "lora.bin"}'
        )
    elif not parent.is_dir():
        problem = (
            f'{key}: {path}: expected a file in an existing directory, found no directory {parent}; '
            f'create it first (mkdir -p {parent})'
        )
    elif not os.access(parent, os.W_OK):
        problem = (
            f'{key}: {path}: expected a directory this user can write, found {parent} read-only; '
            'choose another path'
        )
    else:
        return []
    return [problem]
