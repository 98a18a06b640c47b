"""Our losses against the real InfiniTrain binary's: the same model file, data and flags
(the commands of /work/shared/infinitrain/head-*/README.md, InfiniTrain b24d92f, fp32 on
CPU), with the program name changed to `python -m jaxtrain.main
--config=configs/<model>.py:infinitrain`. Every step within 1e-5 (compare_loss.py's fp32
threshold), and the [CKPT] lines equal theirs. Skipped where the folder is absent."""

import re
from pathlib import Path

import pytest

from cli_runs import run_cli
from infinitrain_samples import copy_run_inputs

SHARED = Path('/work/shared/infinitrain')
LOSS = re.compile(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)')  # scripts/compare_loss.py
GLOG_PREFIX = re.compile(r'^[IWEF]\d{8} [\d:.]+ +\d+ [\w.]+:\d+\] ')
COMMON = '--device cpu --llmc_filepath model.bin --input_bin train.bin --batch_size 2 --sequence_length 64 '
COMMON += '--total_batch_size 128 --num_iteration 20 --learning_rate 0.01'
# head-*/README.md: run (a) saves every 5 steps; run (b) resumes (a)'s step 10.
RUN_A = COMMON + ' --save a --save_interval 5 --max_checkpoint_keep 10 --save_optimizer_state=true'
RUN_B = COMMON + ' --load a/checkpoint_step_000010 --save b --save_interval 5'


def _losses(text: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in map(LOSS.search, text.splitlines()) if m}


def _ckpt_lines(text: str) -> list[str]:
    lines = (GLOG_PREFIX.sub('', line) for line in text.splitlines())
    return [line for line in lines if line.startswith(('[CKPT] Save', '[CKPT] Load done'))]


def _crosscheck(folder: str, model: str, tmp_path, monkeypatch):
    source = SHARED / folder
    if not (source / 'a.log').is_file():
        pytest.skip(f'{source} is not here')
    monkeypatch.chdir(tmp_path)  # the commands use relative paths, as upstream's were run
    copy_run_inputs(source, tmp_path)
    for run, log in ((RUN_A, 'a.log'), (RUN_B, 'b.log')):
        result = run_cli(*run.split(), config=f'configs/{model}.py:infinitrain', num_devices=None)
        assert result.code == 0, result.err
        theirs_text = (source / log).read_text()
        ours, theirs = _losses(result.out), _losses(theirs_text)
        assert sorted(ours) == sorted(theirs) and theirs
        worst = max(abs(ours[step] - theirs[step]) for step in theirs)
        assert worst <= 1e-5, {step: (ours[step], theirs[step]) for step in theirs}
        assert _ckpt_lines(result.out) == _ckpt_lines(theirs_text)


@pytest.mark.slow  # two trainings, 30 steps
def test_gpt2_losses_match_the_infinitrain_binary(tmp_path, monkeypatch):
    _crosscheck('head-gpt2', 'gpt2', tmp_path, monkeypatch)


@pytest.mark.slow
# Compared with the binary's log, not with a program compiled here: XLA's optimizations (fusing the
# 128256-token logits' elementwise work) make these steps several times cheaper.
@pytest.mark.xla_optimized
def test_llama3_losses_match_the_infinitrain_binary(tmp_path, monkeypatch):
    _crosscheck('head-llama3', 'llama3', tmp_path, monkeypatch)
