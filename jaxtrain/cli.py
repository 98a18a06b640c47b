"""`jaxtrain COMMAND [ARGS]`: one command for the trainer and its tools.

    jaxtrain train --config=configs/gpt2.py [--KEY VALUE ...]   (= python -m jaxtrain.main)
    jaxtrain ckpt ls DIR                                         (= python -m jaxtrain.ckpt)
    jaxtrain compare BASE TEST                                   (= python -m jaxtrain.compare_loss)
    jaxtrain bench --config=... [--smoke]                        (= python -m jaxtrain.bench)
    jaxtrain generate --checkpoint DIR [--prompt TEXT]           (= python -m jaxtrain.generate)
    jaxtrain llmc info|convert|shard|tokenizer ...               (= python -m llmc_io)

Only the chosen command's module is imported: the trainer's and the benchmark's absl flags
are module-level and would clash (and every --help would list the other's flags) if both
were defined in one process. `pyproject.toml` registers this as the `jaxtrain` script.
"""

import dataclasses
import importlib
import importlib.util
import runpy
import sys


@dataclasses.dataclass(frozen=True)
class Command:
    module: str  # imported only when this command is chosen
    # A function taking the arguments and returning the exit status (argparse tools), or
    # None: the module is run as __main__, exactly as `python -m MODULE` runs it (absl
    # tools: their --help lists the flags of __main__ and prints its docstring).
    function: str | None
    summary: str


COMMANDS = {
    'train': Command('jaxtrain.main', None, 'train GPT-2 or LLaMA-3 (python -m jaxtrain.main)'),
    'ckpt': Command(
        'jaxtrain.tools.ckpt', 'main', 'list, show, diff, verify, export checkpoints (jaxtrain.ckpt)'
    ),
    'compare': Command(
        'jaxtrain.tools.compare_loss', 'main', "compare two runs' losses (jaxtrain.compare_loss)"
    ),
    'bench': Command('jaxtrain.tools.bench', None, 'time the train step (jaxtrain.bench)'),
    'generate': Command(
        'jaxtrain.tools.generate', 'main', 'sample text from a checkpoint (jaxtrain.generate)'
    ),
    'llmc': Command('llmc_io.__main__', 'main', 'llm.c files: info, convert, shard, tokenizer (llmc_io)'),
}


def installed(command: Command) -> bool:
    """Whether the command's module exists (a command may be listed before it is written)."""
    try:
        return importlib.util.find_spec(command.module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def usage() -> str:
    lines = ['usage: jaxtrain COMMAND [ARGS]  (jaxtrain COMMAND --help for its flags)', '', 'commands:']
    for name, command in COMMANDS.items():
        note = '' if installed(command) else '  [not installed yet]'
        lines.append(f'  {name:9s}{command.summary}{note}')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(
            f'jaxtrain: error: COMMAND: expected one of {", ".join(COMMANDS)}, found {name!r}',
            file=sys.stderr,
        )
        return 2
    if not installed(command):
        print(
            f'jaxtrain {name}: error: not installed yet (its module {command.module} is not in this '
            'jaxtrain)',
            file=sys.stderr,
        )
        return 2
    # The tools name themselves after argv[0] in usage and error lines (tools/command_line.py);
    # absl and ml_collections' --config.KEY overrides read sys.argv (runpy sets argv[0]).
    caller_argv, sys.argv = sys.argv, [f'jaxtrain {name}', *rest]
    if command.function is not None:
        try:
            return getattr(importlib.import_module(command.module), command.function)(rest)
        finally:
            sys.argv = caller_argv
    runpy.run_module(command.module, run_name='__main__', alter_sys=True)  # app.run exits
    return 0


if __name__ == '__main__':
    sys.exit(main())
