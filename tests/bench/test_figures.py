"""bench/figures.py, the one benchmark entry point: a loop's figures are read from its
metrics.jsonl as the numbers say (a file written here, with known times), a peer's from its
median line, MFU by the log's count, the llama figure's loop runs a tiny LLaMA-3 on the shard it
writes, the fused_kernels figure refuses any failed part of its script, the figures are listed, and
an unknown figure is refused in one line."""

import functools
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


def _metrics(path: Path, step_ms: dict, times: dict, saves: dict, mfu: dict | None = None) -> Path:
    rows = [
        {'step': s, 'loss': 10.0 - s / 100, 'step_ms': step_ms[s], 'time': times[s]}
        | ({'mfu': mfu[s]} if mfu else {})
        for s in sorted(step_ms)
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
    # The save of step 12 is followed by steps 13 and 14; step 14's save has none after it.
    assert found['after_save_ms'] == [32.0, 40.0]
    assert found['after_save_worst_vs_median'] == round(40.0 / 31.5, 3)
    assert found['losses'] == [10.0 - s / 100 for s in range(1, 15)]
    assert found['MFU'] is None  # no peak known: the records carry no mfu


def test_a_loop_s_mfu_is_its_records_median(figures, tmp_path):
    step_ms = {s: 900.0 if s <= 10 else [30.0, 31.0, 40.0][s - 11] for s in range(1, 14)}
    mfu = {s: 0.6 * 30.0 / ms for s, ms in step_ms.items()}  # 60% at 30 ms
    path = _metrics(tmp_path / 'metrics.jsonl', step_ms, {s: float(s) for s in step_ms}, {}, mfu)
    assert figures.loop_figures(path, skip=10)['MFU'] == round(0.6 * 30 / 31, 4)


def test_a_peer_s_median_line_and_the_llama_mfu(figures):
    log = 'step   30/30 | train loss 11.7 | (130.10 ms | 62968 tok/s)\n'
    log += 'pytorch-llama3 B=4 median 131.25 ms/step 62415 tok/s\n'
    assert figures.peer_line(log, 'pytorch-llama3') == 131.25
    assert figures.peer_line(log, 'llm.c+cuDNN') is None
    # LLaMA-3.2 1B: 8,220,192,768 FLOPs a token (tests/train/test_dashboards.py writes it out),
    # 8192 tokens a step, against an H200's 989.4 dense bf16 TFLOP/s.
    assert figures.llama_mfu(129.7, 'NVIDIA H200') == pytest.approx(
        8192 * 8_220_192_768 / 0.1297 / 989.4e12, rel=1e-12
    )
    assert figures.llama_mfu(129.7, 'cpu') is None


# The three peers' lines as they print them on the GPU: run_peers.sh's two, plain_jax_step.py's one.
PEER_LINES = {
    'peers': 'llm.c+cuDNN B=16 median 32.62 ms/step 502269 tok/s\n'
    'pytorch-compile B=16 median 39.40 ms/step 415838 tok/s\n',
    'plain_jax_step': 'B=16 unrolled median 35.79 ms/step  457,746 tok/s  loss 7.8277\n',
}


def test_the_peers_figure_reads_all_three_peers_lines(figures, tmp_path):
    """The peers figure on the files its commands write (the lines above, after the command line
    Call.run writes first), and the loop against llm.c from them."""

    class Written(figures.Call):
        def run(self, name, command, timeout=300, env=None):
            (self.out / f'{name}.txt').write_text(' '.join(command) + '\n' + PEER_LINES[name])
            return figures.subprocess.CompletedProcess(command, 0)

    call = Written(tmp_path, steps=20)
    call.build = figures.subprocess.Popen(['true'])
    call.found['loop'] = {'median_step_ms': 31.0, 'wall_ms_per_step': 32.0}
    figures.peers(call)
    assert call.found['peers'] == {
        'llm.c+cuDNN ms': 32.62,
        'pytorch-compile ms': 39.40,
        'plain JAX step ms': 35.79,
    }
    assert call.found['loop_vs_llmc'] == {
        'step lines': round(32.62 / 31.0, 3),
        'wall clock': round(32.62 / 32.0, 3),
    }
    written = [json.loads(line) for line in (tmp_path / 'figures.jsonl').read_text().splitlines()]
    assert [w['figure'] for w in written] == ['peers', 'loop_vs_llmc']


def test_a_median_line_without_a_batch_is_not_a_peer_s(figures):
    lines = [
        'llm.c+cuDNN B=16 median 32.62 ms/step 502269 tok/s',
        'warm-up done; median of 10 ms/step so far',  # says 'median' and 'ms/step', names no B=
        'B=16 unrolled median 35.79 ms/step  457,746 tok/s  loss 7.8277',
    ]
    assert figures.peer_steps(lines) == {'llm.c+cuDNN': 32.62, figures.PLAIN_JAX: 35.79}


# bench/fused_kernels.sh's lines as it prints them: a kernel's best, a loop that ran, one that failed.
MICRO_BEST = 'micro add_layernorm best: fwd 0.0600 ms (rows, warps (4, 4)), fwd+bwd 0.2000 ms = 1.30x xla\n'
LOOP_RAN = 'loop fast-all (deterministic false, fused_kernels all): median step_ms 31.000 over steps 11-60\n'
LOOP_FAILED = 'loop det-all: FAILED (exit 1); last lines of /tmp/fused_kernels/det-all.txt:\n'


def _fused_kernels_call(figures, tmp_path, printed: str, returncode: int):
    """A Call whose run writes what the script would have printed and exits with returncode; it
    keeps the env it was given."""

    class Written(figures.Call):
        def run(self, name, command, timeout=300, env=None):
            self.env = env
            (self.out / f'{name}.txt').write_text(' '.join(command) + '\n' + printed)
            return figures.subprocess.CompletedProcess(command, returncode)

    return Written(tmp_path, steps=20)


def test_the_fused_kernels_figure_records_the_script_s_lines(figures, tmp_path):
    call = _fused_kernels_call(figures, tmp_path, MICRO_BEST + 'micro done in 9 s\n' + LOOP_RAN, 0)
    figures.fused_kernels(call)
    assert call.found['fused_kernels'] == {'line 1': MICRO_BEST.strip(), 'line 2': LOOP_RAN.strip()}
    assert call.env == {'PYTHON': figures.sys.executable}  # the script runs this interpreter


@pytest.mark.parametrize(
    'printed, returncode, why',
    [
        (MICRO_BEST + LOOP_RAN + LOOP_FAILED, 0, 'det-all: FAILED'),  # a failed loop still starts 'loop '
        (MICRO_BEST + LOOP_RAN + LOOP_FAILED + 'FAILED: see the lines above\n', 1, 'exit 1'),
        ('micro FAILED (exit 1)\n' + LOOP_RAN, 0, 'micro FAILED'),  # the micro-benchmark crashed
        (MICRO_BEST + LOOP_RAN, 1, 'exit 1'),
        (MICRO_BEST, 0, 'exit 0'),  # no loop line at all
    ],
)
def test_the_fused_kernels_figure_refuses_a_failure(figures, tmp_path, printed, returncode, why):
    call = _fused_kernels_call(figures, tmp_path, printed, returncode)
    with pytest.raises(RuntimeError, match=why):
        figures.fused_kernels(call)
    assert 'fused_kernels' not in call.found


@pytest.mark.slow
def test_the_llama_figure_runs_the_loop_on_a_llama_shard(figures, tmp_path, monkeypatch):
    """The llama figure's own code, on the tiny LLaMA-3 (CPU): the shard it writes is a LLaMA-3
    shard the loop reads, and its MFU is the log's (a 0.05 TFLOP/s peak given)."""
    tiny = ['--config=configs/llama3.py:tiny', '--batch_size', '1', '--sequence_length', '32']
    # A 0.05 TFLOP/s peak keeps MFU large enough that its rounding to 4 decimals stays inside 1%.
    tiny += ['--total_batch_size', '32', '--sample_every', '0', '--peak_tflops', '0.05']
    monkeypatch.setattr(figures, 'LLAMA_LOOP', tiny)
    # One CPU device: conftest.py's 8 fake devices would time the mesh, not the step.
    monkeypatch.setenv('XLA_FLAGS', '')
    monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
    # 16M parameters (LLaMA-3's vocabulary) run cheaper compiled with XLA's optimizations, and the
    # run is compared with nothing compiled in this process.
    monkeypatch.setenv('JAX_DISABLE_MOST_OPTIMIZATIONS', '0')
    monkeypatch.setattr(figures, 'LLAMA_TOKENS_PER_STEP', 32)
    monkeypatch.setattr(figures, 'LLAMA_SHARD', tmp_path / 'llama3_train.bin')
    # 2 steps skipped instead of 10 (test_a_loop_s_figures_come_from_its_records covers the skip).
    monkeypatch.setattr(figures, 'loop_figures', functools.partial(figures.loop_figures, skip=2))
    call = figures.Call(tmp_path, 5)  # 3 timed steps: an odd median
    figures.llama(call)

    import llmc_io

    assert llmc_io.shard_info(tmp_path / 'llama3_train.bin').kind == 'llama3'
    found = call.found['llama']
    assert found['median_step_ms'] > 0 and found['tokens_per_s'] > 0
    # tiny: C 64, L 2, F 192, K·H 2·16, V 128256; N without wte: 2 layers of 64·(64 + 2·32) + 64²
    # + 3·64·192 + 2·64, ln_f 64, lm_head 128256·64; T 32, 32 tokens a step.
    n = 2 * (64 * 128 + 64 * 64 + 3 * 64 * 192 + 2 * 64) + 64 + 128256 * 64
    flops_per_step = (6 * n + 12 * 2 * 64 * 32) * 32
    assert found['MFU'] == pytest.approx(flops_per_step / (found['median_step_ms'] / 1e3) / 0.05e12, rel=1e-2)
    assert json.loads((tmp_path / 'figures.jsonl').read_text().splitlines()[-1])['figure'] == 'llama'


def test_a_run_that_stopped_before_the_skipped_steps_is_refused(figures, tmp_path):
    path = _metrics(tmp_path / 'metrics.jsonl', {1: 900.0, 2: 30.0}, {1: 1.0, 2: 1.1}, {})
    with pytest.raises(RuntimeError, match='expected step records after step 10, found steps up to 2'):
        figures.loop_figures(path)


def test_every_figure_is_listed_with_what_it_needs(figures, capsys):
    assert figures.main(['--list']) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(figures.FIGURES)
    assert {'loop', 'deterministic', 'saves', 'peers', 'seed', 'profile', 'lora'} <= set(listed)
    assert {'llama', 'llama_peer', 'llama_profile'} <= set(listed)


def test_an_unknown_figure_is_refused(figures, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        figures.main([str(tmp_path), '--figures', 'loop,nonesuch'])
    assert stopped.value.code == 2
    assert 'found nonesuch' in capsys.readouterr().err
