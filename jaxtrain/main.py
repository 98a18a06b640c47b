"""Train GPT-2 or LLaMA-3 on llm.c files.

  python -m jaxtrain.main --config=configs/gpt2.py[:variant] [--config.KEY=VALUE] [--KEY VALUE]
  (or: jaxtrain train ...)

Every key of the config is a flag below, by topic, with its meaning and default; a config file's
own value is named where it sets another. Booleans take --KEY, --noKEY and --KEY=true|false. On
many hosts, run one of these per process (the repository's launch/ has the launchers).
"""

# Flags -> config -> XLA flags -> distributed init (parallel/platform.py; a no-op for one
# process) -> check_config -> train/loop.run(config). The keys and their help: config/keys.py.

import logging as std_logging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from jaxtrain.parallel import platform
from jaxtrain.config import flags as key_flags
from jaxtrain.config import help_topics, infinitrain_flags
from jaxtrain.config.keys import shipped_config
from jaxtrain.config.flags import quiet_absl

# configs/ of the checkout, or jaxtrain/configs/ of a non-editable install
_DEFAULT_CONFIG = str(shipped_config('gpt2.py') or 'configs/gpt2.py')
# absl heads --help's flag list with the defining module's name, which for __main__ is argv[0]
# (runpy makes it this file's path, also under `jaxtrain train`): the command's name instead.
if __name__ == '__main__':
    sys.argv[0] = 'python -m jaxtrain.main'
config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'config file, e.g. configs/gpt2.py:tiny', lock_config=True
)
flags.FLAGS['config'].default_as_str = "'configs/gpt2.py'"  # --help: not this checkout's path
_VERBOSE = flags.DEFINE_boolean('verbose', False, 'print a traceback with errors')
_KEY_FLAGS = key_flags.define_key_flags()
_INFINITRAIN_FLAGS = infinitrain_flags.define_flags()  # --save, --device, ... (InfiniTrain's names)
key_flags.BOOLEAN_FLAGS.update(infinitrain_flags.boolean_names())
flags.adopt_module_key_flags(key_flags)  # so --help lists every training key, not only --config
flags.adopt_module_key_flags(infinitrain_flags)


def _enable_compilation_cache():
    """Reuses compiled programs across runs: a resumed run starts in seconds."""
    import jax

    if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
        from jaxtrain.data.default_corpus import cache_dir

        jax.config.update('jax_compilation_cache_dir', str(cache_dir() / 'xla'))


class _WithoutOrbaxErrors(std_logging.Filter):
    """Orbax logs a failed background save with its tracebacks before raising it to the
    loop, which reports it in one line (checkpoint/layout.py); the tracebacks need --verbose."""

    def filter(self, record):
        return record.levelno < std_logging.ERROR or '/orbax/' not in record.pathname.replace('\\', '/')


_HIDE_ORBAX_ERRORS = _WithoutOrbaxErrors()


def main(argv):
    if len(argv) > 1:
        print(
            f'error: unexpected arguments {argv[1:]}; flags look like --KEY VALUE or --config.KEY=VALUE',
            file=sys.stderr,
        )
        return 2
    if not flags.FLAGS['verbosity'].present:
        # JAX and Orbax log every compile and save at INFO; our own lines are enough.
        logging.set_verbosity(logging.WARNING)
    if _VERBOSE.value:
        logging.get_absl_logger().removeFilter(_HIDE_ORBAX_ERRORS)
    else:
        logging.get_absl_logger().addFilter(_HIDE_ORBAX_ERRORS)
    try:
        import jax

        from jaxtrain.checks.config_checks import check_config, deterministic_wanted

        config = flags.FLAGS.config
        key_flags.apply_key_flags(config, _KEY_FLAGS, warn=print)
        infinitrain_flags.apply(config, _INFINITRAIN_FLAGS)
        platform.request_deterministic(
            deterministic_wanted(config) and not platform.pinned_to_cpu(config.device)
        )
        _enable_compilation_cache()
        platform.request(config.device)
        joined = platform.initialize_distributed(config)  # before anything asks JAX for devices
        platform.check(config.device)
        if joined and jax.process_index() == 0:
            print(joined, flush=True)
        if joined and not _VERBOSE.value and jax.default_backend() == 'cpu':
            platform.silence_native_stdout()
        check_config(config)  # the one validation: before metrics_dir or checkpoint_dir is created
        from jaxtrain.train import loop as train

        with quiet_absl(not _VERBOSE.value and not flags.FLAGS['verbosity'].present):
            return train.run(config)
    except infinitrain_flags.FlagError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    except Exception as e:  # one line for people; the traceback on request
        return key_flags.report_error(e, _VERBOSE.value)


def _parse_command_line(argv):
    """--help by topic (config/help_topics.py), every other command line as flags.py parses it."""
    if help_topics.asks_for_topic_help(argv):
        try:
            print(help_topics.topic_help(__doc__, key_flags.__name__, infinitrain_flags.__name__), flush=True)
        except BrokenPipeError:  # `| head` read what it wanted; the exit's own flush would raise again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    return key_flags.parse_command_line(argv)


def entry_point():
    app.run(lambda argv: sys.exit(main(argv)), flags_parser=_parse_command_line)


if __name__ == '__main__':
    entry_point()
