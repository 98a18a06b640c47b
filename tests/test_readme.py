"""Every command in README.md's code blocks, and in the docs/ files that took README's depth,
runs as written.

Each runs under bash in a fresh directory holding the repository's configs/ and launch/
(so relative paths mean what they mean in a checkout) and the placeholder files a reader
supplies: TRAIN.bin (a token shard) and MODEL.bin (a small llm.c GPT-2 model), and the
directories the commands' `> dir/file` redirections write into. The commands of one block
run in order in one directory (the seed experiment's later lines read the earlier ones'
checkpoints and logs). GPU, SLURM, install and test-suite commands are listed but skipped,
with the reason (readme_commands.NOT_IN_CI), and so are README's repeats of docs/ recipes that
tests/test_docs.py runs.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from jaxtrain.checkpoint.layout import committed_steps
from readme_commands import MULTIPROCESS_TEST, needs, readme_commands, trains_the_default_model
from trainer_runs import REPO, random_shard, tiny_llmc_model

# docs/ files whose commands no other test runs: most need GPUs, SLURM or real weights, and are
# checked here to be classified so; the rest run like README's.
DOCS = ('docs/lora.md', 'docs/parallelism.md', 'docs/infinitrain.md', 'docs/configuration.md')
README_COMMANDS = readme_commands(REPO / 'README.md')
COMMANDS = README_COMMANDS + [c for doc in DOCS for c in readme_commands(REPO / doc)]


def test_the_readme_has_commands_and_each_is_classified():
    assert len(README_COMMANDS) >= 5
    runnable = [c for c in README_COMMANDS if needs(c) is None]
    assert any('jaxtrain.main' in c.text for c in runnable)
    # The first-screen command is the one that runs with XLA's optimizations (a 16M model).
    assert [c.line for c in COMMANDS if trains_the_default_model(c)] == [13]
    # The CPU launcher line (README or docs/) is the launch tests/parallel/test_multiprocess.py makes.
    launcher_lines = [c for c in COMMANDS if c.text.startswith('launch/local_multiprocess.sh')]
    assert all(needs(c) == MULTIPROCESS_TEST for c in launcher_lines), launcher_lines


def test_ci_runs_the_readme_test_command_verbatim():
    """README's second set-up line is what CI runs: .ci/run holds it as a line of its own."""
    readme_line = next(
        line
        for line in (REPO / 'README.md').read_text().splitlines()
        if line.startswith('pip install -e') and 'pytest' in line
    )
    command = readme_line.split('  #')[0].strip()
    assert command == "pip install -e '.[test]' && python -m pytest -q"
    assert command in (REPO / '.ci' / 'run').read_text().splitlines()


def test_the_readme_tour_repeats_the_docs_recipes_word_for_word():
    """README's tour shows the text recipe and the TensorBoard run as docs/text.md runs them, so
    the test of that file covers them; a tour line edited apart from its recipe would run here."""
    texts = [c.text for c in README_COMMANDS if (needs(c) or '').startswith('runs as written in docs/')]
    shown = ('llmc_io shard book.txt', '--tensorboard_dir tb', 'generate --checkpoint run', '--format hf')
    for part in shown:
        assert any(part in text for text in texts), f'README tour: no docs recipe with {part!r}'


@pytest.fixture(scope='module')
def block_dirs(tmp_path_factory):
    """One working directory per README block, made on first use."""
    made = {}

    def directory(block):
        if block not in made:
            root = tmp_path_factory.mktemp(f'readme_block{len(made)}')
            for name in ('configs', 'launch'):
                (root / name).symlink_to(REPO / name)
            random_shard(root / 'TRAIN.bin', num_tokens=20_000, vocab=512)
            tiny_llmc_model(root / 'MODEL.bin', vocab=512)
            made[block] = root
        return made[block]

    return directory


@pytest.fixture(scope='module')
def bin_dir(tmp_path_factory):
    """A directory for PATH holding this interpreter's bin/ and, where `pip install` has not
    made one (a checkout used through PYTHONPATH), the `jaxtrain` console script as pip
    writes it from [project.scripts]: `jaxtrain.cli:main`."""
    bin_dir = os.path.dirname(sys.executable)
    if shutil.which('jaxtrain', path=bin_dir):
        return bin_dir
    shim_dir = tmp_path_factory.mktemp('bin')
    shim = shim_dir / 'jaxtrain'
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m jaxtrain.cli "$@"\n')
    shim.chmod(0o755)
    return f'{shim_dir}{os.pathsep}{bin_dir}'


def _prepare_redirections(command: str, cwd) -> None:
    for target in re.findall(r'>\s*(\S+)', command):
        if '/' in target and not target.startswith('&'):
            (cwd / target).parent.mkdir(parents=True, exist_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    'command', COMMANDS, ids=[f'{c.source}:line{c.line}:{c.text[:40]}' for c in COMMANDS]
)
def test_readme_command_runs_as_written(command, block_dirs, bin_dir):
    why = needs(command)
    if why:
        pytest.skip(f'{command.source} line {command.line} {why}: {command.text}')
    cwd = block_dirs((command.source, command.block))
    _prepare_redirections(command.text, cwd)
    env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS',)}  # a user's plain shell
    env.update(
        PATH=f'{bin_dir}{os.pathsep}{env.get("PATH", "")}',
        PYTHONPATH=str(REPO),
        JAX_PLATFORMS='cpu',
    )
    if trains_the_default_model(command):  # its own compiles: no other test's program
        env['JAX_DISABLE_MOST_OPTIMIZATIONS'] = '0'
    result = subprocess.run(
        ['bash', '-c', f'set -o pipefail; {command.text}'],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    logs = ''.join(p.read_text()[-2000:] for p in cwd.glob('*/*.log'))
    assert result.returncode == 0, (
        f'{command.source} line {command.line}: '
        f'{command.text}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{logs}'
    )
    if command.text.startswith('python -m jaxtrain.compare_loss base test'):
        # The seed experiment's claim, as its comment states it: every step after the resume
        # equal to the uninterrupted run's (the threshold alone would let 1e-5 pass). The next
        # line's `ckpt diff` exits 0 only for bit-identical checkpoints. This run is the one of
        # GPT-2 fp32; tests/train/test_seed_experiment.py runs LLaMA-3 bf16.
        assert '60/60 compared steps matched, max abs diff 0.00e+00' in result.stdout, result.stdout
        assert committed_steps(cwd / 'ck' / 'gpt2-noresume') == [20, 40, 60, 80, 100]
        assert committed_steps(cwd / 'ck' / 'gpt2-resumefrom40') == [60, 80, 100]


QUICKSTART = readme_commands(REPO / 'docs' / 'quickstart.md')


@pytest.mark.slow  # one training step and an export: about 30 s on 2 cores
def test_quickstart_makes_the_files_readme_names_offline(tmp_path, bin_dir):
    """docs/quickstart.md's recipe, as written, in a directory that has only configs/: it makes
    TRAIN.bin, MODEL.bin and gpt2_124M.bin, which llmc_io's own readers (NumPy only) then read as a
    GPT-2 shard and GPT-2 llm.c model files."""
    import llmc_io

    assert len(QUICKSTART) == 6  # all run here, the stand-in gpt2_124M.bin's copy too
    (tmp_path / 'configs').symlink_to(REPO / 'configs')
    env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
    env.update(PATH=f'{bin_dir}{os.pathsep}{env.get("PATH", "")}', PYTHONPATH=str(REPO), JAX_PLATFORMS='cpu')
    for command in QUICKSTART:
        result = subprocess.run(['bash', '-c', f'set -o pipefail; {command.text}'], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, f'{command.text}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}'
    shard = llmc_io.shard_info(str(tmp_path / 'TRAIN.bin'))
    assert shard.kind == 'gpt2' and shard.num_tokens > 25_600  # the seed experiment's 100 steps fit
    for name in ('MODEL.bin', 'gpt2_124M.bin'):
        model_header, _ = llmc_io.load_model(str(tmp_path / name))
        assert isinstance(model_header, llmc_io.GPT2Header) and model_header.vocab_size == 50257
    assert 'step    2/2' in result.stdout  # the last line trained on both


def test_the_seed_experiment_of_gpt2_runs_here():
    """test_seed_experiment.py leaves GPT-2 fp32 to README's seed block: that block must stay in
    README and run here, or the exact-resume claim for GPT-2 goes untested."""
    seeds = [c for c in COMMANDS if c.text.startswith('python -m jaxtrain.compare_loss base test')]
    assert len(seeds) == 1 and needs(seeds[0]) is None
    block = [c for c in COMMANDS if (c.source, c.block) == (seeds[0].source, seeds[0].block)]
    assert sum('--resume_from ck/gpt2-noresume/checkpoint_step_000040' in c.text for c in block) == 1
    assert all(needs(c) is None for c in block)
