"""Progress on long work: the corpus build, the compiling step, a periodic progress line
beside (not inside) InfiniTrain's step line, and the end-of-run summary."""

import json
import re

import numpy as np
import pytest

from jaxtrain.data import default_corpus
from jaxtrain.train import progress as progress_lib
from trainer_runs import load_config, random_shard, tiny_llmc_model, train

# InfiniTrain's step line as its compare_loss.py reads it (docs/formats.md).
INFINITRAIN_STEP = re.compile(r'^step\s+\d+/\d+ \| train loss [\d.]+ \| lr [\d.e+-]+ \| \(.* ms \| .* tok/s')


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_line_every_interval_with_eta_from_steps_after_the_compiling_one():
    clock, lines = FakeClock(), []
    progress = progress_lib.Progress(0, 100, 256, lines.append, clock=clock)
    assert lines == ["compiling the train step (step 1's time includes it)..."]
    clock.now += 40.0  # step 1: compilation, longer than the interval: no rate to show yet
    progress.step(1, 5.0, 40.0)
    assert len(lines) == 1
    for step in range(2, 22):  # 2 s a step: 40 s later
        clock.now += 2.0
        progress.step(step, 5.0 - step / 100, 2.0, grad_norm=step / 8)
    # at step 2 (a rate exists: 0.5 steps/s, from the steps after the compiling one), then
    # 30 s later (step 17); ETA = steps left / rate; the last step's gradient norm.
    assert lines[1:] == [
        'progress: step 2/100 (2%) | elapsed 0:00:42 | 0.50 steps/s | ETA 0:03:16 | grad norm 0.25',
        'progress: step 17/100 (17%) | elapsed 0:01:12 | 0.50 steps/s | ETA 0:02:46 | grad norm 2.125',
    ]
    progress.summary([20])
    assert lines[-1] == (
        'summary: 21 steps (1-21) | 5,376 tokens | wall 0:01:20 | 128 tokens/s mean | '
        'loss final 4.790000, best 4.790000 at step 21 | checkpoints written: 1 (step 20)'
    )


def test_a_one_step_run_gives_no_mean_rate_and_names_its_one_checkpoint():
    clock, lines = FakeClock(), []
    progress = progress_lib.Progress(0, 1, 256, lines.append, clock=clock)
    clock.now += 30.0
    progress.step(1, 5.0, 30.0)  # its time is the compilation's, not a rate
    progress.summary([1])
    assert lines[-1] == (
        'summary: 1 step (1-1) | 256 tokens | wall 0:00:30 | tokens/s n/a (one step, which compiled) | '
        'loss final 5.000000, best 5.000000 at step 1 | checkpoints written: 1 (step 1)'
    )


@pytest.mark.slow
def test_progress_lines_and_summary_on_a_real_run(tmp_path, monkeypatch):
    monkeypatch.setattr(progress_lib, 'PROGRESS_EVERY_S', 0.0)  # a progress line after every step
    config = load_config(
        'gpt2',
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        metrics_dir=str(tmp_path / 'metrics'),
        num_iteration=4,
        learning_rate=1e-3,  # the tiny model's rate in the checkpoint tests: their compiled step
    )
    code, losses, out = train(config)
    assert code == 0, out
    lines = out.splitlines()
    step_lines = [i for i, line in enumerate(lines) if line.startswith('step ')]
    assert len(step_lines) == 4 and all(INFINITRAIN_STEP.match(lines[i]) for i in step_lines)
    assert lines[step_lines[0] - 1] == "compiling the train step (step 1's time includes it)..."
    summary = [line for line in lines if line.startswith('summary: ')]
    assert len(summary) == 1 and lines.index(summary[0]) > step_lines[-1]
    tokens = config.total_batch_size * 4
    best_step = min(losses, key=losses.get)
    assert summary[0].startswith(f'summary: 4 steps (1-4) | {tokens:,} tokens | wall 0:00:')
    assert f'loss final {losses[4]:.6f}, best {losses[best_step]:.6f} at step {best_step}' in summary[0]
    assert summary[0].endswith('checkpoints written: 0')
    # the gradient norm metrics.jsonl records, in the progress line and not in InfiniTrain's step line
    rows = [json.loads(line) for line in (tmp_path / 'metrics' / 'metrics.jsonl').read_text().splitlines()]
    norms = {row['step']: row['grad_norm'] for row in rows if 'grad_norm' in row}
    shown = dict(re.findall(r'^progress: step (\d+)/4 .* \| grad norm ([\d.e+-]+)', out, re.M))
    assert shown and {int(s): g for s, g in shown.items()} == {s: f'{norms[s]:.4g}' for s in map(int, shown)}
    assert not any('grad' in lines[i] for i in step_lines)
    mean = float(re.search(r'([\d,]+) tokens/s mean', summary[0]).group(1).replace(',', ''))
    step_ms = [float(re.search(r'\(([\d.]+) ms', lines[i]).group(1)) for i in step_lines[1:]]
    assert np.isclose(mean, config.total_batch_size * 3 / (sum(step_ms) / 1e3), rtol=0.02)


def test_building_the_corpus_says_so_once(tmp_path, monkeypatch):
    small = np.arange(3 * default_corpus.VAL_TOKENS, dtype=np.uint16) % 256
    monkeypatch.setattr(default_corpus, 'build_tokens', lambda: small)
    lines = []
    default_corpus.ensure_default_corpus(tmp_path, report=lines.append)
    assert len(lines) == 2
    assert lines[0].startswith('data: building the built-in corpus') and str(tmp_path) in lines[0]
    assert re.fullmatch(r'data: built 393,216 tokens in [\d.]+ s', lines[1])
    default_corpus.ensure_default_corpus(tmp_path, report=lines.append)  # cached: silent
    assert len(lines) == 2
