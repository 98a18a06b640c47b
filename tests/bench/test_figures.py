"""bench/figures.py, the one benchmark entry point: a loop's figures are read from its
metrics.jsonl as the numbers say (a file written here, with known times), the figures are
listed, and an unknown figure is refused in one line."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def figures():
    spec = importlib.util.spec_from_file_location('bench_figures', REPO / 'bench' / 'figures.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(path: Path, step_ms: dict, times: dict, saves: dict) -> Path:
    rows = [
        {'step': s, 'loss': 10.0 - s / 100, 'step_ms': step_ms[s], 'time': times[s]} for s in sorted(step_ms)
    ]
    rows += [{'step': s, 'save_blocked_s': b} for s, b in saves.items()]
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return path


def test_a_loop_s_figures_come_from_its_records(figures, tmp_path):
    # Steps 1-14: 900 ms (compiling) then 30, 31, 32, 40; the records' clock 0.1 s apart after step 10.
    step_ms = {s: 900.0 if s <= 10 else [30.0, 31.0, 32.0, 40.0][s - 11] for s in range(1, 15)}
    times = {s: 100.0 + 0.1 * s for s in range(1, 15)}
    path = _metrics(tmp_path / 'metrics.jsonl', step_ms, times, {12: 0.0004, 14: 0.0009})
    found = figures.loop_figures(path, skip=10, tokens=16384)
    assert found['median_step_ms'] == 31.5  # of 30, 31, 32, 40
    assert found['wall_ms_per_step'] == pytest.approx(100.0)  # 0.4 s over 4 steps
    assert found['tokens_per_s'] == 163840
    assert found['save_blocked_ms_max'] == 0.9
    assert found['losses'] == [10.0 - s / 100 for s in range(1, 15)]


def test_a_run_that_stopped_before_the_skipped_steps_is_refused(figures, tmp_path):
    path = _metrics(tmp_path / 'metrics.jsonl', {1: 900.0, 2: 30.0}, {1: 1.0, 2: 1.1}, {})
    with pytest.raises(RuntimeError, match='expected step records after step 10, found steps up to 2'):
        figures.loop_figures(path)


def test_every_figure_is_listed_with_what_it_needs(figures, capsys):
    assert figures.main(['--list']) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(figures.FIGURES)
    assert {'loop', 'deterministic', 'saves', 'peers', 'seed', 'profile', 'llama', 'lora'} <= set(listed)


def test_an_unknown_figure_is_refused(figures, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        figures.main([str(tmp_path), '--figures', 'loop,nonesuch'])
    assert stopped.value.code == 2
    assert 'found nonesuch' in capsys.readouterr().err
