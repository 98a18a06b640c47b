"""`jaxtrain COMMAND`: the console script is registered, dispatches to the tools (llm.c's files
too, as `jaxtrain llmc`), and `jaxtrain train` is the same run as `python -m jaxtrain.main`; each
tool names itself as it was started, and stops quietly when its reader goes (`| head`)."""

import functools
import os
import re
import subprocess
import sys
import tomllib

import pytest

from infinitrain_samples import SAMPLES, needs_samples
from process_env import one_device_env
from trainer_runs import REPO, metrics_losses, random_shard, tiny_llmc_model

from jaxtrain import cli

# What `pip install` makes of [project.scripts] jaxtrain = "jaxtrain.cli:main": a script
# that imports jaxtrain.cli and exits with main()'s status; `-m jaxtrain.cli` runs the same.
JAXTRAIN = [sys.executable, '-m', 'jaxtrain.cli']


def _run(command, **kwargs):
    env = one_device_env(PYTHONPATH=str(REPO), JAX_PLATFORMS='cpu')
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, **kwargs)


def test_pyproject_registers_the_jaxtrain_script():
    scripts = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['scripts']
    module, function = scripts['jaxtrain'].split(':')
    assert (module, function) == ('jaxtrain.cli', 'main')


def _step_lines(out: str) -> list[str]:
    """InfiniTrain's step lines (`train loss`; not the val and sample lines) less their
    timings, which differ between two runs."""
    return [
        re.sub(r'\(.*\)', '', line)
        for line in out.splitlines()
        if line.startswith('step ') and '| train loss' in line
    ]


@pytest.mark.slow
def test_jaxtrain_train_is_the_same_run_as_python_m_jaxtrain_main(tmp_path):
    # A small-vocabulary model on a token shard: the dispatch, not the model, is under test, and
    # a run on its own shard prints no text sample (a decoder compile per process). The second
    # process finds the first one's train step in the persistent compilation cache.
    model, shard = tiny_llmc_model(tmp_path / 'model.bin'), random_shard(tmp_path / 'train.bin')
    args = ['--config=configs/gpt2.py', '--llmc_filepath', model, '--input_bin', shard]
    args += ['--num_iteration', '2', '--num_devices', '1']
    main = _run([sys.executable, '-m', 'jaxtrain.main', *args, '--metrics_dir', str(tmp_path / 'main')])
    train = _run([*JAXTRAIN, 'train', *args, '--metrics_dir', str(tmp_path / 'cli')])
    assert main.returncode == 0, main.stderr
    assert train.returncode == 0, train.stderr
    assert len(_step_lines(main.stdout)) == 2
    assert _step_lines(train.stdout) == _step_lines(main.stdout)
    assert metrics_losses(tmp_path / 'cli') == metrics_losses(tmp_path / 'main')


@functools.cache
def _absl_help(name: str) -> subprocess.CompletedProcess:
    """`jaxtrain NAME --help` of an absl tool (train, bench), run once for the tests that read it."""
    return _run([*JAXTRAIN, name, '--help'])


@functools.cache
def _ckpt_ls_of_nothing() -> subprocess.CompletedProcess:
    """`jaxtrain ckpt ls` of a directory that is not there (the tool imports JAX before it
    looks: seconds a process), run once for the two tests that read its error."""
    return _run([*JAXTRAIN, 'ckpt', 'ls', str(REPO / 'no such dir')])


@pytest.mark.slow
def test_each_command_reaches_its_own_tool_and_only_it():
    # Importing the trainer and the benchmark in one process would define --config twice.
    # --help prints __main__'s docstring and its flags, and exits 0 (absl's own exits 1).
    train = _absl_help('train')
    assert train.returncode == 0 and 'Train GPT-2 or LLaMA-3' in train.stdout, train.stderr
    assert '--save_steps' in train.stdout and '--save_every:' not in train.stdout
    bench = _absl_help('bench')
    assert bench.returncode == 0 and "Benchmark the trainer's own train step" in bench.stdout, bench.stderr
    assert '--save_every:' in bench.stdout
    cited = set(re.findall(r'\b([\w/]+\.md)\b', bench.stdout))  # documents --help points to exist
    assert cited and all((REPO / name).is_file() for name in cited), cited
    ckpt = _ckpt_ls_of_nothing()
    assert ckpt.returncode == 2 and 'ckpt ls: error' in ckpt.stderr, ckpt.stderr


def test_a_command_whose_module_is_absent_says_not_installed_yet(monkeypatch, capsys):
    monkeypatch.setitem(
        cli.COMMANDS, 'future', cli.Command('jaxtrain.tools.not_written_yet', 'main', 'a later tool')
    )
    assert cli.main(['future', '--help']) == 2
    assert 'not installed yet' in capsys.readouterr().err
    assert cli.main([]) == 2
    listing = capsys.readouterr().out
    assert re.search(r'future\s+a later tool\s+\[not installed yet\]', listing)
    assert (
        re.search(r'train\s+train GPT-2', listing)
        and 'train GPT-2 or LLaMA-3 (python -m jaxtrain.main)  [' not in listing
    )


def test_an_unknown_command_is_one_line_naming_the_commands(capsys):
    assert cli.main(['trian']) == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'train, ckpt, compare, bench' in err and "'trian'" in err


@pytest.mark.slow
def test_errors_name_the_command_as_it_was_typed(tmp_path):
    missing = str(tmp_path / 'no such dir')
    ckpt = _ckpt_ls_of_nothing()
    assert ckpt.returncode == 2 and ckpt.stderr.startswith('jaxtrain ckpt ls: error: '), ckpt.stderr
    # An argument generate refuses before it reads the model, or imports JAX (seconds a process).
    bad_top_k = ['--llmc_filepath', missing, '--top_k', '-1']
    for typed, command, label in (
        ([sys.executable, '-m', 'jaxtrain.ckpt'], ['ls', missing], 'python -m jaxtrain.ckpt ls: error: '),
        ([*JAXTRAIN, 'compare'], [missing, missing], 'jaxtrain compare: error: '),
        ([*JAXTRAIN, 'generate'], bad_top_k, 'jaxtrain generate: error: '),
        ([*JAXTRAIN, 'llmc'], ['info', '--bogus'], 'usage: jaxtrain llmc '),
    ):
        result = _run([*typed, *command])
        assert result.returncode == 2 and result.stderr.startswith(label), (typed, result.stderr)
    assert sys.argv[0] != 'jaxtrain ckpt'  # an in-process call leaves the caller's argv alone
    cli.main(['ckpt', 'ls', missing])
    assert not sys.argv[0].startswith('jaxtrain ')


def test_jaxtrain_llmc_is_python_m_llmc_io(tmp_path):
    from trainer_runs import random_shard

    shard = random_shard(tmp_path / 'train.bin')
    ours = _run([*JAXTRAIN, 'llmc', 'info', shard])
    theirs = _run([sys.executable, '-m', 'llmc_io', 'info', shard])
    assert ours.returncode == 0 and ours.stdout == theirs.stdout and 'tokens' in ours.stdout, ours.stderr


@pytest.mark.slow
@needs_samples
def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """`... | head -1`: the tool's stdout closes before it writes; it exits 141 (128 + SIGPIPE) and
    prints no traceback."""
    from trainer_runs import random_shard

    shard = random_shard(tmp_path / 'train.bin')
    for run in ('base', 'test'):  # one InfiniTrain step line each
        (tmp_path / run).mkdir()
        (tmp_path / run / 'gpt2.log').write_text(
            'step    1/1 | train loss 10.000000 | lr 1.00e-04 | (1.00 ms | 1 tok/s | peak used:     0 MB | '
            'peak reserved:     0 MB, DP=1, TP=1, SP=1, PP=1)\n'
        )
    env = {**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'}
    for command in (
        [sys.executable, '-m', 'jaxtrain.ckpt', 'ls', str(SAMPLES / 'head-gpt2' / 'a')],
        [*JAXTRAIN, 'llmc', 'info', shard],
        [sys.executable, '-m', 'jaxtrain.compare_loss', str(tmp_path / 'base'), str(tmp_path / 'test')],
    ):
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdout.close()  # gone before the first line is written
        err = process.stderr.read().decode()
        assert process.wait(timeout=120) == 141 and err == '', (command, err)


def _help_texts() -> dict[str, str]:
    """Every tool's --help (each subcommand's too): argparse's in process, absl's from the command."""
    import argparse

    from jaxtrain.tools import ckpt, compare_loss, generate
    from llmc_io import __main__ as llmc

    texts = {}
    for name, parser in (('ckpt', ckpt.build_parser()), ('compare', compare_loss.build_parser()),
                         ('generate', generate.build_parser()), ('llmc', llmc._parser())):  # fmt: skip
        texts[name] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                texts.update({f'{name} {sub}': p.format_help() for sub, p in action.choices.items()})
    for name in ('train', 'bench'):
        result = _absl_help(name)
        assert result.returncode == 0, result.stderr
        texts[name] = result.stdout
    return texts


def test_help_texts_name_no_file_of_the_package():
    """A user reads --help without the source: no module file, no path of this checkout. Config
    files (configs/gpt2.py) and llm.c's own scripts (llm.c's fineweb.py) are theirs to know."""
    texts = _help_texts()
    assert {'ckpt ls', 'ckpt diff', 'llmc shard', 'train', 'bench'} <= set(texts)
    for name, text in texts.items():
        assert str(REPO) not in text, name
        files = re.findall(r"(llm\.c(?: \w+)?'s |configs/)?\b([\w/]+\.py)\b", ' '.join(text.split()))
        internal = [f for owner, f in files if not owner]
        assert not internal, (name, internal)
