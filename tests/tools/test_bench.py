"""The benchmark's CI smoke run: `python -m jaxtrain.bench --smoke` on the CPU, in a child
process (it owns its flags and XLA backend), gives sane numbers and survives a save/restore; its
MFU is the training log's, recomputed here from the tiny GPT-2's shape by hand."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_reports_speed_losses_and_checkpoint_costs(tmp_path):
    out = tmp_path / 'bench.json'
    # One CPU device: the 8 fake devices of conftest.py would time the mesh, not the step.
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ''}
    command = [
        sys.executable,
        '-m',
        'jaxtrain.bench',
        '--config=configs/gpt2.py:tiny',
        '--smoke',
        '--profile_steps=1',
        '--peak_tflops=0.5',  # a CPU has no data-sheet peak
    ]
    done = subprocess.run(
        [*command, '--json', str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(out.read_text())
    assert (result['devices'], result['deterministic']) == (1, False)
    assert result['timed_steps'] == 2 and len(result['step_ms']) == 2
    assert result['median_step_ms'] > 0 and result['tokens_per_s'] > 0 and result['compile_s'] > 0
    assert result['tokens_per_s'] == result['tokens_per_step'] / (result['median_step_ms'] / 1e3)
    assert result['matmul_burst_flops'] > 0 and result['matmul_sustained_flops'] > 0

    # MFU by the log's count: 6N + 12LTC, N = every parameter of the tiny GPT-2 (C 64, L 2, vocab
    # padded to 50304) but wpe: wte 50304·64, 2 blocks of 12C² + 13C, ln_f's 2C.
    C, L, T = 64, 2, result['sequence_length']
    flops_per_token = 6 * (50304 * C + L * (12 * C * C + 13 * C) + 2 * C) + 12 * L * T * C
    assert result['flops_per_token'] == flops_per_token
    assert result['peak_flops_per_device'] == 0.5e12
    assert result['mfu'] == pytest.approx(flops_per_token * result['tokens_per_s'] / 0.5e12, rel=1e-9)
    assert f"MFU {100 * result['mfu']:.1f}% of 0.5 TFLOP/s per device" in done.stdout
    assert math.isfinite(result['first_loss']) and math.isfinite(result['last_loss'])
    # A random-init GPT-2 starts near ln(50257) = 10.8.
    assert abs(result['first_loss'] - math.log(50257)) < 0.5

    # --smoke saves once to warm up, then after each of the 2 steps of its saving phase, then
    # restores the newest, each save blocking only for its snapshot and hand-off.
    assert len(result['saved_steps']) == 2 and len(result['save_blocked_ms']) == 2
    assert all(ms > 0 for ms in result['save_blocked_ms']) and result['warmup_save_blocked_ms'] > 0
    assert result['blocking_saves'] == 0  # CPU memory has room for the snapshot
    assert result['restore_s'] > 0 and result['checkpoint_bytes'] > 0
    assert result['phase_tokens_per_s_with_saves'] > 0 and result['phase_tokens_per_s_without_saves'] > 0
    assert math.isfinite(result['saving_last_loss'])

    # The profiler traced a step; a CPU trace has no device rows, and the block says so.
    assert result['profile_steps'] == 1 and result['kernel_ms_per_step'] == {}
    assert 'kernels     none on a device' in done.stdout

    # The printed block names the mode and the XLA flags, so two runs can be compared by eye.
    assert 'mode        fast' in done.stdout and "XLA_FLAGS=''" in done.stdout
