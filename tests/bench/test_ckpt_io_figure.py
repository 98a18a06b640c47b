"""bench/ckpt_io.py, the ckpt_io figure: a save's figures come from the run's metrics as the
numbers say (rows written here, with known times), dd's rate from dd's own line, the PyTorch
peers get the model's parameters layer by layer, and the whole figure runs at the tiny shape on a
CPU, committing, verifying and resuming a real InfiniTrain step."""

import json
import subprocess
import sys

import pytest
from bench_loader import load_bench


@pytest.fixture(scope='module')
def ckpt_io():
    return load_bench('ckpt_io')


def test_a_save_s_figures_come_from_the_run_s_rows(ckpt_io):
    # Steps 2-4 take 100, 110, 120 ms; the save at step 4 held the loop 0.5 ms and was recorded at
    # t = 50.0005; its directory appeared at t = 60; steps 5-7 end at t = 51, 55 and 61.
    rows = [
        {'step': s, 'loss': 1.0, 'step_ms': ms, 'time': t}
        for s, ms, t in (
            (1, 9000.0, 49.0),
            (2, 100.0, 49.5),
            (3, 110.0, 49.8),
            (4, 120.0, 50.0),
            (5, 300.0, 51.0),
            (6, 130.0, 55.0),
            (7, 100.0, 61.0),
        )
    ]
    rows.append({'step': 4, 'save_blocked_s': 0.0005, 'time': 50.0005})
    found = ckpt_io.save_figures(rows, 4, 20 * 10**9, written_at=60.0)
    assert found['median_step_ms'] == 105.0  # of steps 2-3 (step 1 compiles; the save step is out)
    assert found['blocked_ms'] == 0.5
    assert found['commit_s'] == 10.0 and found['commit GB/s'] == 2.0  # 20 GB in 10 s
    assert found['after_save_ms'] == [300.0, 130.0]
    assert found['after_save_vs_median'] == round(300 / 105, 3)
    assert found['steps during the write'] == 2 and found['their median_ms'] == 215.0  # steps 5, 6


def test_dd_s_rate_is_its_bytes_over_its_seconds(ckpt_io, tmp_path):
    line = '8589934592 bytes (8.6 GB, 8.0 GiB) copied, 5.2 s, 1.7 GB/s\n'
    assert ckpt_io.dd_rate('128+0 records in\n128+0 records out\n' + line) == round(8589934592 / 5.2e9, 3)
    done = subprocess.run(
        ['dd', 'if=/dev/zero', f'of={tmp_path / "x"}', 'bs=1M', 'count=2'], capture_output=True, text=True
    )
    assert ckpt_io.dd_rate(done.stderr) > 0  # this machine's dd prints the line the figure reads


def test_the_peers_hold_the_model_s_parameters_layer_by_layer(ckpt_io):
    shapes = ckpt_io.parameter_shapes('configs/llama3.py:llama3.2-1b')
    total = sum(__import__('math').prod(dims) for dims in shapes.values())
    assert total == 1_498_482_688  # what the run prints for LLaMA-3.2 1B (untied head)
    # q, k, v in one kernel: 2048 + 2 x 8 KV heads x 64
    assert shapes['h/attn/c_attn/kernel/15'] == [2048, 3072] and 'h/attn/c_attn/kernel/16' not in shapes
    assert shapes['lm_head/kernel'] == [2048, 128256]


@pytest.mark.slow
def test_the_figure_runs_at_the_tiny_shape_on_a_cpu(ckpt_io, tmp_path, monkeypatch):
    figures = load_bench('figures')
    monkeypatch.setenv('XLA_FLAGS', '')  # one CPU device, not conftest's eight
    monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
    monkeypatch.setenv('CKPT_IO_DIR', str(tmp_path / 'disk'))
    monkeypatch.setattr(figures, 'SHARD', tmp_path / 'train.bin')
    monkeypatch.setattr(ckpt_io, 'TOOLS', True)
    figures._write_shard(tmp_path / 'train.bin')
    call = figures.Call(tmp_path / 'out', 0)
    call.out.mkdir()
    shape = ckpt_io.shape_of('tiny')
    flags = figures._loop_flags(shape['config'], shape['batch'], shape['sequence'])
    env = {**figures.os.environ, 'PYTHONPATH': figures._python_path()}
    ckpt_io.measure(
        call, 'tiny', flags, tmp_path / 'train.bin', env, sys.executable, formats=('infinitrain',)
    )
    found = call.found['ckpt_io_infinitrain']
    assert found['step_GiB'] > 0 and found['commit_s'] > 0 and found['blocked_ms'] < 1000
    assert isinstance(found['verify_s'], float) and found['restore_s'] > 0
    assert found['resumed first_step_s'] > found['restore_s']
    # the step exported to InfiniTrain's PR generation and diffed with it
    assert isinstance(found['export to infinitrain-bin_s'], float) and isinstance(
        found['diff with the export_s'], float
    )
    assert call.found['ckpt_io_disk']['write GB/s'] > 0
    assert not (tmp_path / 'disk').exists()  # every step it wrote is gone
    written = [json.loads(x)['figure'] for x in (call.out / 'figures.jsonl').read_text().splitlines()]
    assert written == ['ckpt_io_disk', 'ckpt_io_torch', 'ckpt_io_no_saves', 'ckpt_io_infinitrain']
