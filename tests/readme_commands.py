"""The shell commands of README.md's (and docs/ files') code blocks, as written, and what each
needs to run.

A command is a line of a fenced ```bash / ```sh / ```shell block, or of an indented
(4-space) block whose line starts like a command; a line ending in `\\` continues on the
next; a `# comment` after the command is dropped. `A && B` where A is a `pip install` runs
B only (the install is CI's own first step, .ci/run).

`needs(command)` says why a command cannot run in CI (GPUs, SLURM, the network, or being
the test suite itself) or why it need not (another test runs it, e.g. README's tour repeats
docs/ recipes that tests/test_docs.py runs and checks), or None: then the test runs it. A
command after one that does not run, in the same block, does not run either: it reads what
that one would have written.
"""

import dataclasses
import functools
import re
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r'^```\s*(\w*)\s*$')
_SHELL_FENCES = ('bash', 'sh', 'shell', 'console')  # a bare ``` block is text (the layout)
_COMMAND_START = re.compile(r'^(python|launch/|jaxtrain\b|pip\b|sbatch\b|[A-Z_]+=\S*\s)')
_COMMENT = re.compile(r'(^|\s)#\s.*$')

# Two trainer processes started by the launcher, as README's line starts them, then checked
# against one process; running README's line as well would start the same two again.
MULTIPROCESS_TEST = 'runs in tests/parallel/test_multiprocess.py (the same launcher, two processes)'

INSTALL = 'installs packages (needs the network; .ci/run does it)'
TEST_SUITE = 'is the test suite itself (CI runs it)'

# (pattern, why it does not run in CI). The first match wins.
NOT_IN_CI = (
    (re.compile(r'\bsbatch\b'), 'needs SLURM'),
    (re.compile(r'PLATFORM=gpu|\bGPUS=|launch/one_host\.sh|bench/figures\.py'), 'needs GPUs'),
    (re.compile(r'^pip install'), INSTALL),
    (re.compile(r'python -m pytest'), TEST_SUITE),
    (re.compile(r'--device cuda\b'), 'needs GPUs'),
    (
        re.compile(r'--pipeline_parallel [2-9]'),
        'needs one device per pipeline stage (GPUs; CI has one CPU device)',
    ),
    (re.compile(r'gpt2_124M'), "needs the downloaded GPT-2 124M weights (llm.c's gpt2_124M.bin)"),
    (re.compile(r'\bit_run\b'), "needs a checkpoint directory written by InfiniTrain's binary"),
    (re.compile(r'^launch/local_multiprocess\.sh '), MULTIPROCESS_TEST),
    (re.compile(r'^tensorboard '), 'starts the TensorBoard server, which runs until stopped'),
    (
        re.compile(r'--llmc_filepath model\.bin --input_bin train\.bin'),
        "reads upstream's lrs-gpt2 sample files (tests/train/test_infinitrain_lr_crosscheck.py "
        'runs its commands on them)',
    ),
    (
        re.compile(r'^python bench/recompute_memory\.py'),
        "measures GPT-2 124M's memory for minutes of CPU (a measurement, not a check)",
    ),
)

# docs/ files whose commands a test runs as written and then checks what they wrote; the same
# command elsewhere (README's tour) is not run a second time.
RUN_BY_DOCS_TESTS = {
    'docs/text.md': 'tests/test_docs.py',
    'docs/dashboards.md': 'tests/test_docs.py',
    'docs/checkpoints.md': 'tests/test_docs.py',
    'docs/quickstart.md': 'tests/test_readme.py (test_quickstart_...)',
}


@dataclasses.dataclass(frozen=True)
class Command:
    text: str
    block: int  # index of its code block: commands of one block run in order, in one directory
    line: int  # line of its file where it starts
    source: str = 'README.md'  # its file, relative to the repository
    after: int | None = None  # the line of an earlier command of its block that does not run


def _strip_comment(line: str) -> str:
    return _COMMENT.sub('', line).rstrip()


def _commands_of(lines: list[tuple[int, str]], block: int) -> list[Command]:
    commands, pending, start = [], '', None
    for number, raw in lines:
        line = _strip_comment(raw.strip())
        if not line and not pending:
            continue
        if start is None:
            start = number
        if line.endswith('\\'):
            pending += line[:-1].rstrip() + ' '
            continue
        text = (pending + line).strip()
        pending, first = '', start
        start = None
        for part in _split_install(text):
            commands.append(Command(part, block, first))
    return commands


def _split_install(text: str) -> list[str]:
    """`pip install X && Y` -> ['pip install X', 'Y'] (Y runs without the install)."""
    match = re.match(r'^(pip install \S+(?: \S+)*?) && (.*)$', text)
    return [match.group(1), match.group(2)] if match else [text]


def readme_commands(path: Path) -> list[Command]:
    """The commands of a Markdown file, each knowing its file and whether an earlier command of
    its block does not run."""
    source = path.relative_to(path.parent.parent).as_posix() if path.parent.name == 'docs' else path.name
    commands, skipped_in_block = [], {}
    for command in _parse(path):
        command = dataclasses.replace(command, source=source, after=skipped_in_block.get(command.block))
        if _own_needs(command) not in (None, INSTALL, TEST_SUITE):  # CI installs; pytest writes nothing
            skipped_in_block.setdefault(command.block, command.line)
        commands.append(command)
    return commands


def _parse(path: Path) -> list[Command]:
    lines = path.read_text().splitlines()
    commands, block, index = [], 0, 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence:
            end = index + 1
            while end < len(lines) and not lines[end].startswith('```'):
                end += 1
            if fence.group(1) in _SHELL_FENCES:
                body = [(n + 1, lines[n]) for n in range(index + 1, end)]
                commands += _commands_of(body, block)
                block += 1
            index = end + 1
            continue
        previous_blank = index == 0 or not lines[index - 1].strip()
        if previous_blank and lines[index].startswith('    ') and _COMMAND_START.match(lines[index].strip()):
            end = index
            while end < len(lines) and lines[end].startswith('    '):
                end += 1
            commands += _commands_of([(n + 1, lines[n]) for n in range(index, end)], block)
            block += 1
            index = end
            continue
        index += 1
    return commands


def needs(command: Command) -> str | None:
    why = _own_needs(command)
    if why is None and command.after is not None:
        return f'follows line {command.after} of its block, which does not run here'
    return why


def _own_needs(command: Command) -> str | None:
    for pattern, why in NOT_IN_CI:
        if pattern.search(command.text):
            return why
    if re.search(r'(^|\s)\.\.\.(\s|$)', command.text):
        return 'has a placeholder (...) for the reader to fill in'
    for source, test in RUN_BY_DOCS_TESTS.items():
        if source != command.source and command.text in _texts_of(source):
            return f'runs as written in {source}, by {test}'
    return None


@functools.cache
def _texts_of(source: str) -> frozenset[str]:
    return frozenset(c.text for c in _parse(_REPO / source))


def trains_the_default_model(command: Command) -> bool:
    """Whether the command trains configs/gpt2.py's default `small` GPT-2 (16M parameters, its
    size not set by an llm.c file): XLA's optimizing passes halve its step time on a CPU for a
    second more of compile, a saving over its ten default steps."""
    return (
        command.text.startswith('python -m jaxtrain.main ')
        and re.search(r'--config=configs/gpt2\.py(\s|$)', command.text) is not None
        and '--llmc_filepath' not in command.text
        and '--config.model' not in command.text
        and '--num_iteration' not in command.text
    )
