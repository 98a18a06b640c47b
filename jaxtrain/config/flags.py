"""Plain flags for every config key, so InfiniTrain's commands run with only the program
name changed: `--input_bin X`, `--num_iteration 100`, `--save_optimizer_state true`.

They apply after `--config.KEY=VALUE` overrides. Booleans take every spelling gflags and
absl accept: `--flag`, `--noflag`, `--flag=false` and `--flag true|false|1|0` (a bare
`--flag` followed by another flag is true, and never swallows that flag).

`parse_command_line` is the parser main.py gives absl's app.run: a mistyped key, a value
of the wrong type or a config file that is not there is reported on one line, like every
other error of the trainer, with the closest key suggested for a typo.

`quiet_absl` keeps absl's warnings, Orbax's among them, out of normal runs; --verbose shows
them. Orbax logs through absl a warning for every item saved without its own _CHECKPOINT_METADATA
(`Metadata file does not exist: .../params/_CHECKPOINT_METADATA`), which is how the trainer's
checkpoints are written: a user of the trainer (`--init_from`, `--resume_from`), `jaxtrain.ckpt` or
`jaxtrain.generate` would read it as a damaged checkpoint. Every entry point runs its work inside
quiet_absl(not verbose). Only absl's own logger is raised to ERROR: JAX's warnings go through
Python's logging under their own names and still show. No JAX import here, so a tool can enter it
before JAX starts.
"""

import contextlib
import difflib
import logging as std_logging
import re
import sys
import traceback

from absl import flags

from jaxtrain.config.help_topics import help_with_default
from jaxtrain.config.keys import KEYS, resolve_config_argument

_TRUE, _FALSE = ('true', '1', 'yes', 'on'), ('false', '0', 'no', 'off')
# The one key without a flag of its own: the config file (configs/gpt2.py or llama3.py) decides it.
_SET_BY_CONFIG_FILE = 'model_family'
BOOLEAN_FLAGS: set[str] = set()  # string flags holding a boolean (normalize_booleans)


def parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f'--{name}: expected true or false, found {text!r}')


def define_key_flags():
    """One flag per config key (absl's own --log_dir etc. keep their meaning)."""
    defined = []
    for key, default, text in KEYS:
        if key in flags.FLAGS or key == _SET_BY_CONFIG_FILE:
            continue
        text = help_with_default(key, text, default)
        if isinstance(default, bool):
            flags.DEFINE_string(key, None, f'{text} [true|false]')
            BOOLEAN_FLAGS.add(key)
        elif isinstance(default, int):
            flags.DEFINE_integer(key, None, text)
        elif isinstance(default, float):
            flags.DEFINE_float(key, None, text)
        else:
            flags.DEFINE_string(key, None, text)
        defined.append(key)
    return defined


def normalize_booleans(argv: list[str], names) -> list[str]:
    """Rewrites the boolean flags in `argv` to `--name=value`, so that absl (which holds them
    as strings) reads every gflags/absl spelling: `--name` -> true, `--noname` -> false,
    `--name VALUE` -> VALUE when the next word is not a flag. Nothing after `--` changes."""
    names = set(names)
    out, i = list(argv[:1]), 1
    while i < len(argv):
        arg = argv[i]
        if arg == '--':
            out += argv[i:]
            break
        bare = arg.lstrip('-') if arg.startswith('-') and '=' not in arg else None
        if bare in names:
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is not None and not following.startswith('-'):
                out.append(f'--{bare}={following}')
                i += 2
                continue
            out.append(f'--{bare}=true')
        elif bare and bare.startswith('no') and bare[2:] in names and bare not in flags.FLAGS:
            out.append(f'--{bare[2:]}=false')
        else:
            out.append(arg)
        i += 1
    return out


def _given_on_command_line(key: str) -> bool:
    """`--KEY` or `--config.KEY=` was on the command line (not only in the config file)."""
    if key in flags.FLAGS and flags.FLAGS[key].present:
        return True
    return any(re.match(rf'^--?config\.{key}(=|$)', arg) for arg in sys.argv[1:])


def derive_total_batch_size(config, warn) -> None:
    """`--batch_size 8` alone: the config's total_batch_size (256 tokens by default, as
    InfiniTrain's) would not be a multiple of 8 x 64, so take one micro-step per rank
    (total_batch_size 0, data/stream.py's batch_geometry) and say so, instead of refusing the run."""
    changed = [k for k in ('batch_size', 'sequence_length') if _given_on_command_line(k)]
    if not changed or _given_on_command_line('total_batch_size') or config.total_batch_size <= 0:
        return
    if config.batch_size <= 0 or config.sequence_length <= 0:
        return  # check_config names the bad key
    per_rank = config.batch_size * config.sequence_length
    if config.total_batch_size % per_rank == 0:
        return  # accumulation as InfiniTrain computes it
    warn(
        f'total_batch_size: not given, and the default {config.total_batch_size} is not a multiple of '
        f'batch_size × sequence_length = {per_rank}; training with one micro-step per rank '
        f'({per_rank} × data-parallel ranks tokens per step). Pass --total_batch_size to choose.'
    )
    config.total_batch_size = 0


# llm.c's train_gpt2cu validates every 20 steps by default (-v 20); InfiniTrain's default is 0.
DEFAULT_VAL_LOSS_EVERY = 20


def derive_val_loss_every(config, warn) -> None:
    """`--input_val_bin` without `--val_loss_every` (0, InfiniTrain's default): validation would never
    run, so run it every 20 steps as llm.c does (at the last step of a shorter run; at the saves
    keep_best ranks) and say so in one line."""
    if not config.input_val_bin or config.val_loss_every or _given_on_command_line('val_loss_every'):
        return
    if config.keep_best and config.save_steps > 0:
        every, why = config.save_steps, 'save_steps, which keep_best ranks'
    else:
        every = max(1, min(DEFAULT_VAL_LOSS_EVERY, config.num_iteration))
        why = f"llm.c's {DEFAULT_VAL_LOSS_EVERY}" + (
            ', or num_iteration' if every < DEFAULT_VAL_LOSS_EVERY else ''
        )
    warn(
        f'val_loss_every: not given, so validating on input_val_bin every {every} steps ({why}); '
        'pass --val_loss_every N to choose, 0 for none'
    )
    config.val_loss_every = every


def apply_key_flags(config, keys, warn) -> None:
    """Copies every flag the user set onto `config` (a ConfigDict)."""
    for key in keys:
        flag = flags.FLAGS[key]
        if not flag.present:
            continue
        value = flag.value
        if isinstance(config[key], bool):
            value = parse_bool(key, value)
        elif isinstance(config[key], float):
            value = float(value)
        config[key] = value
    derive_total_batch_size(config, warn)
    derive_val_loss_every(config, warn)


# --- the command line as a whole --------------------------------------------------

_VERBOSE_SPELLINGS = ('--verbose', '--verbose=true', '--verbose=1')
_EXPECTED_BY_PARSER = {
    'IntegerParser': 'an integer',
    'FloatParser': 'a number',
    'BooleanParser': 'true or false',
}


def _did_you_mean(name: str, candidates, prefix: str = '--') -> str:
    """'; did you mean --X?' for the nearest candidate, '' when none is near."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f'; did you mean {prefix}{match[0]}?' if match else ''


def _unknown_config_key(argv) -> str | None:
    """The first `--config.KEY` whose KEY the config does not have, as a message
    (ml_collections would stop with a traceback). The config is flat: KEY is one name."""
    known = [key for key, _, _ in KEYS]
    for arg in argv[1:]:
        match = re.match(r'^--?(?:no)?config\.([^=]+)', arg)
        if match and match.group(1) not in known:
            key = match.group(1)
            return (
                f'--config.{key}: expected one of the config keys, found {key!r}'
                f"{_did_you_mean(key, known, '--config.')} (--help lists every key)"
            )
    return None


def _flag_error_message(error: flags.Error) -> str:
    if isinstance(error, flags.UnrecognizedFlagError):
        name = error.flagname
        if name == _SET_BY_CONFIG_FILE:
            return (
                f'--{name}: expected no such flag (the config file sets the family), found one. '
                'Pass --config=configs/gpt2.py or --config=configs/llama3.py instead.'
            )
        return (
            f'--{name}: expected a known flag, found {name!r}'
            f'{_did_you_mean(name, flags.FLAGS)} (--help lists every key)'
        )
    text = str(error).strip()
    # absl: 'flag --batch_size=abc: invalid literal for int() with base 10: ...'
    match = re.match(r'^flag --([\w.]+)=(.*?): ', text, re.DOTALL)
    if match and match.group(1) in flags.FLAGS:
        name, value = match.groups()
        parser = type(flags.FLAGS[name].parser).__name__
        if parser in _EXPECTED_BY_PARSER:
            return f'--{name}: expected {_EXPECTED_BY_PARSER[parser]}, found {value!r}'
        reason = text[match.end() :].strip().splitlines()
        return f'--{name}: could not use {value!r}: ' + (reason[-1] if reason else type(error).__name__)
    return text.splitlines()[0] if text else type(error).__name__


def _config_file_problem() -> str | None:
    """ml_collections keeps a config file it could not load as an object that raises on
    first use; asking here names the file instead of failing later without its name."""
    if 'config' not in flags.FLAGS:
        return None
    flag = flags.FLAGS['config']
    path = (flag.config_filename or '').split(':', 1)[0]
    try:
        value = flag.value
        if value is None:
            return f'--config: {path}: expected get_config to return an ml_collections ConfigDict, found None'
        value.get('model_family')
    except OSError:
        return f'--config: expected a config file such as configs/gpt2.py[:variant], found nothing at {path}'
    except Exception as error:  # noqa: BLE001  whatever the file does, one line naming it
        return _config_load_message(path, error)
    return None


def _config_argument(argv: list[str]) -> str:
    """The config file named on the command line (without its :variant)."""
    for i, arg in enumerate(argv):
        if arg.startswith(('--config=', '-config=')):
            return arg.split('=', 1)[1].split(':', 1)[0]
        if arg in ('--config', '-config') and i + 1 < len(argv):
            return argv[i + 1].split(':', 1)[0]
    return 'the config file'


def _config_load_message(path: str, error: Exception) -> str:
    """One line for a config file that could not be loaded: a syntax error, no get_config, or an
    exception of its own (its traceback with --verbose)."""
    if isinstance(error, SyntaxError):
        return (
            f'--config: {path}: expected a Python file, found a syntax error at line {error.lineno}: '
            f'{error.msg}; fix the file'
        )
    if isinstance(error, AttributeError) and 'get_config' in str(error):
        return (
            f'--config: {path}: expected a function get_config(variant) returning a ConfigDict, found none '
            '(configs/gpt2.py shows one)'
        )
    text = ' '.join(str(error).split()) or type(error).__name__
    return (
        f'--config: {path}: expected the file to load, found that it raised {type(error).__name__}: '
        f'{text[:200]} (--verbose shows where)'
    )


def report_error(error: Exception, verbose: bool) -> int:
    """An error that stops a run, as one line on stderr (its first line, and its type), the
    traceback too with --verbose; returns the exit status 1. The trainer and the bench use it."""
    if verbose:
        traceback.print_exc()
    message = str(error).strip().splitlines()[0] if str(error).strip() else ''
    print(
        f'error: {message or type(error).__name__} ({type(error).__name__}; --verbose for a traceback)',
        file=sys.stderr,
    )
    return 1


def _fail(message: str, verbose: bool):
    if verbose:
        traceback.print_exc()
    print(f'error: {message}', file=sys.stderr)
    sys.exit(1)


_HELP_FLAGS = {f'{dashes}{name}' for dashes in ('-', '--') for name in ('help', 'helpfull', 'helpshort', '?')}


def exit_zero_after_help(parse, argv: list[str]):
    """parse(argv), except that a --help absl answers (it prints, then exits 1) exits 0: the
    user asked for it, and a script checking the status should not see a failure."""
    try:
        return parse(argv)
    except SystemExit as stop:
        if stop.code == 1 and _HELP_FLAGS.intersection(argv[1:]):
            raise SystemExit(0) from None
        raise


def parse_command_line(argv: list[str]) -> list[str]:
    """absl's flag parsing with every mistake on one line on stderr and exit status 1
    (a traceback too with --verbose). Returns the arguments left after the flags."""
    argv = resolve_config_argument(argv)  # --config=configs/... from any directory
    verbose = any(arg in _VERBOSE_SPELLINGS for arg in argv)
    problem = _unknown_config_key(argv)
    if problem:
        _fail(problem, verbose=False)
    argv = normalize_booleans(argv, BOOLEAN_FLAGS)
    absl_logger = std_logging.getLogger('absl')
    level = absl_logger.level
    # ml_collections warns through absl about a get_config returning None; the line below says it.
    absl_logger.setLevel(std_logging.ERROR)
    try:
        remaining = exit_zero_after_help(flags.FLAGS, argv)
    except flags.Error as error:
        _fail(_flag_error_message(error), verbose)
    except Exception as error:  # noqa: BLE001  ml_collections runs the config file while parsing
        _fail(_config_load_message(_config_argument(argv), error), verbose)
    finally:
        absl_logger.setLevel(level)
    problem = _config_file_problem()
    if problem:
        _fail(problem, verbose=False)
    return remaining


@contextlib.contextmanager
def quiet_absl(quiet: bool = True):
    """absl's logger at ERROR while the block runs (when `quiet`), its level as it was afterwards."""
    logger = std_logging.getLogger('absl')
    level = logger.level
    if quiet:
        logger.setLevel(std_logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
