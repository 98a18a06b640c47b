"""The LR-scheduler generation (InfiniTrain PR 151, a7949ac0) against the real binary's runs in
../shared/infinitrain/lrs-*: its commands with the program name changed print the same lr column digit
for digit and the same losses within 1e-5, write its lr_scheduler.ckpt byte for byte, and resume its
step-10 directory (and ours) into b.log's steps 11-20."""

import gzip
import re
import shutil

import pytest
from cli_runs import run_cli
from infinitrain_samples import SAMPLES, sample_commands

from llmc_io.infinitrain.state import read_trainer_state

STEP = re.compile(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)\s+\|\s+lr\s+(\S+)\s')
GLOG_PREFIX = re.compile(r'^[IWEF]\d{8} [\d:.]+ +\d+ [\w.]+:\d+\] ')


def _steps(text: str) -> dict[int, tuple[float, str]]:
    return {int(m[1]): (float(m[2]), m[3]) for m in map(STEP.search, text.splitlines()) if m}


def _ckpt_lines(text: str) -> list[str]:
    """The [CKPT] lines, less upstream's end-of-run copy into checkpoint_final, which jaxtrain does not
    write (a copy of the last step; see docs/infinitrain.md)."""
    lines = (GLOG_PREFIX.sub('', line) for line in text.splitlines())
    kept = ('[CKPT] Save', '[CKPT] Load done', '[CKPT] Loading LR')
    return [line for line in lines if line.startswith(kept) and 'checkpoint_final' not in line]


def _same_as_log(result, log_text: str, steps) -> None:
    assert result.code == 0, result.err
    ours, theirs = _steps(result.out), _steps(log_text)
    assert sorted(ours) == sorted(theirs) == list(steps)
    assert [ours[s][1] for s in steps] == [theirs[s][1] for s in steps]  # the lr column, as printed
    worst = max(abs(ours[s][0] - theirs[s][0]) for s in steps)
    assert worst <= 1e-5, {s: (ours[s][0], theirs[s][0]) for s in steps}


@pytest.fixture
def folder(tmp_path, monkeypatch, request):
    source = SAMPLES / request.param
    if not (source / 'a.log').is_file():
        pytest.skip(f'{source} is not here')
    monkeypatch.chdir(tmp_path)  # the commands use relative paths, as upstream's were run
    for path in source.rglob('*'):
        if path.is_file() and path.suffix != '.log':
            out = tmp_path / path.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == '.gz':
                with gzip.open(path) as packed, open(out.with_suffix(''), 'wb') as unpacked:
                    shutil.copyfileobj(packed, unpacked)
            else:
                shutil.copyfile(path, out)
    (tmp_path / 'theirs').mkdir()
    for run in ('a', 'b', 'l', 'n'):
        if (tmp_path / run).is_dir():
            (tmp_path / run).rename(tmp_path / 'theirs' / run)
    return request.param, source, tmp_path


def _crosscheck(folder, family: str, runs=('a.log',)):
    name, source, here = folder
    commands = sample_commands(name)
    config = f'configs/{family}.py:infinitrain'
    for log in runs:  # ours into a/, l/, n/ as upstream's commands say, in InfiniTrain's files
        result = run_cli(
            *commands[log], '--checkpoint_format', 'infinitrain', config=config, num_devices=None
        )
        text = (source / log).read_text()
        _same_as_log(result, text, range(1, len(_steps(text)) + 1))
        assert _ckpt_lines(result.out) == _ckpt_lines(text)
        run = log[0]
        theirs = sorted((here / 'theirs' / run).glob('checkpoint_step_*'))
        assert theirs
        for step_dir in theirs:
            ours = here / run / step_dir.name
            scheduler = step_dir / 'lr_scheduler.ckpt'
            if scheduler.is_file():
                assert (ours / 'lr_scheduler.ckpt').read_bytes() == scheduler.read_bytes(), ours
            else:
                assert not (ours / 'lr_scheduler.ckpt').exists()
            mine, upstream = (
                read_trainer_state(ours / 'trainer_state.json'),
                read_trainer_state(step_dir / 'trainer_state.json'),
            )
            assert mine.generation == upstream.generation == 'lrs' and mine.last_lr is None
            upstream_lines = (step_dir / 'trainer_state.json').read_text().splitlines()[1:-1]
            assert (ours / 'trainer_state.json').read_text().splitlines()[1 : len(upstream_lines) + 1] == [
                line if line.endswith(',') else line + ',' for line in upstream_lines
            ]  # upstream's keys, in its order and spelling; then our "jaxtrain" line
    b_command = commands['b.log']
    b_text = (source / 'b.log').read_text()
    for resumed in ('theirs/a', 'a'):  # the binary's step-10 directory, then ours
        argv = [w.replace('a/checkpoint_step_000010', f'{resumed}/checkpoint_step_000010') for w in b_command]
        argv = [w if w != 'b' else f'b-{resumed.replace("/", "-")}' for w in argv]
        result = run_cli(*argv, '--checkpoint_format', 'infinitrain', config=config, num_devices=None)
        _same_as_log(result, b_text, range(11, 21))
        assert [
            line.replace(f'{resumed}/', 'a/') for line in _ckpt_lines(result.out) if 'Save' not in line
        ] == [line for line in _ckpt_lines(b_text) if 'Save' not in line]
        final = here / argv[argv.index('--save') + 1] / 'checkpoint_step_000020' / 'lr_scheduler.ckpt'
        assert final.read_bytes() == (here / 'theirs/b/checkpoint_step_000020/lr_scheduler.ckpt').read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize('folder', ['lrs-gpt2'], indirect=True)
def test_gpt2_runs_and_resumes_as_the_lr_scheduler_binary(folder):
    _crosscheck(folder, 'gpt2', runs=('a.log', 'l.log', 'n.log'))


@pytest.mark.slow
# Compared with the binary's log, not with a program compiled here: XLA's optimizations (fusing the
# 128256-token logits' elementwise work) make these steps several times cheaper.
@pytest.mark.xla_optimized
@pytest.mark.parametrize('folder', ['lrs-llama3'], indirect=True)
def test_llama3_runs_and_resumes_as_the_lr_scheduler_binary(folder):
    _crosscheck(folder, 'llama3')
