"""TensorBoard / W&B curves and MFU (train/dashboards.py, train/progress.py).

The event files are read back with TensorBoard's own reader (EventAccumulator), and every scalar
is compared with what the run printed (InfiniTrain's step lines, the val lines) or recorded
(metrics.jsonl); MFU is recomputed here from the model's shape by the PaLM count, written out
from docs/formats.md's GPT-2 parameter count. W&B is a fake module that records its calls, and, where
the wandb package is installed, the real one offline, its `.wandb` file read back record by record.
"""

import importlib.machinery
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jaxtrain.train.progress import (
    PEAK_TFLOPS,
    MFUMeter,
    peak_flops_per_device,
    peak_row,
    training_flops_per_token,
)
from jaxtrain.train.progress import Progress
import llmc_io
from trainer_runs import load_config, random_shard, tiny_llmc_model, train


def _printed_and_float32(printed: float, unit: float) -> float:
    """How far TensorBoard's float32 of a value may lie from the step line's print of it, rounded
    to `unit`: half a unit, plus float32's rounding (2^-24 relative, taken twice for safety)."""
    return unit / 2 + abs(printed) * 2**-23


STEP_LINE = re.compile(
    r'step\s+(\d+)/\d+ \| train loss ([\d.]+) \| lr ([\d.e+-]+) \| \(([\d.]+) ms \| (\d+) tok/s'
)
VAL_LINE = re.compile(r'step\s+(\d+)/\d+ \| val loss ([\d.]+)')


def fake_wandb():
    """A stand-in for the wandb package: init() returns a run that keeps what it was given."""
    module = types.ModuleType('wandb')
    module.__spec__ = importlib.machinery.ModuleSpec('wandb', None)
    module.runs = []

    class Run:
        def __init__(self, **kwargs):
            self.init, self.logged, self.finished, self.config = kwargs, [], False, {}
            self.config = types.SimpleNamespace(update=lambda values, **_: self.recorded.update(values))
            self.recorded = {}

        def define_metric(self, name, step_metric=None):
            self.step_metric = step_metric or getattr(self, 'step_metric', None)

        def log(self, values):
            self.logged.append(dict(values))

        def finish(self, exit_code=0):
            self.finished, self.exit_code = exit_code == 0, exit_code

    def init(**kwargs):
        module.runs.append(Run(**kwargs))
        return module.runs[-1]

    module.init = init
    return module


def gpt2_flops_per_token(config, T):
    """PaLM's 6N + 12·L·T·C, N = docs/formats.md's GPT-2 count less wpe (maxT·C)."""
    C, L, Vp = config.channels, config.num_layers, config.padded_vocab_size
    n = Vp * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * L * T * C


def test_flops_per_token_and_peaks():
    from jaxtrain.models.gpt2 import VARIANTS
    from jaxtrain.models.llama3 import VARIANTS as LLAMA_VARIANTS

    d12 = VARIANTS['d12']
    # 124,475,904 parameters (docs/formats.md) less wpe's 1024·768: 6·123,689,472 + 12·12·1024·768.
    assert training_flops_per_token('gpt2', d12, 1024) == 855_383_040 == gpt2_flops_per_token(d12, 1024)
    # LLaMA-3.2 1B (L16, C2048, 32/8 heads of 64, SwiGLU 8192, V 128256, untied head), N without wte:
    # a layer's c_attn 2048·(2048 + 2·512) = 6,291,456, c_proj 2048² = 4,194,304, its SwiGLU
    # 3·2048·8192 = 50,331,648 and two RMSNorms 4,096: 60,821,504, times 16 = 973,144,064; ln_f
    # 2,048 and lm_head 128256·2048 = 262,668,288: N = 1,235,814,400. 6N = 7,414,886,400, and
    # attention 12·16·2048·2048 = 805,306,368.
    assert training_flops_per_token('llama3', LLAMA_VARIANTS['llama3.2-1b'], 2048) == 8_220_192_768
    assert peak_flops_per_device('NVIDIA H200', 'bfloat16') == 989.4e12
    assert peak_flops_per_device('NVIDIA H100 PCIe', 'float32') == 378e12
    # The first name contained wins: L40 and L40S are not the L4 (data sheets: dense bf16 181, 362, 121).
    assert [peak_flops_per_device(f'NVIDIA {n}', 'bfloat16') for n in ('L40', 'L40S', 'L4')] == [
        181e12,
        362e12,
        121e12,
    ]
    assert peak_flops_per_device('cpu', 'bfloat16') is None
    assert peak_flops_per_device('cpu', 'float32', override_tflops=2.5) == 2.5e12


def test_each_device_picks_its_own_row_of_the_peaks():
    # jax's device_kind names the whole part: a GH200 contains 'H200', an L40S 'L40' and 'L4'.
    assert peak_row('NVIDIA GH200 480GB') == 'GH200'
    assert peak_row('NVIDIA H200') == 'H200'
    for name, _ in PEAK_TFLOPS:
        assert peak_row(f'NVIDIA {name} 80GB') == name
    assert peak_row('cpu') is None


def test_mfu_of_a_step_on_an_h200():
    from jaxtrain.models.llama3 import VARIANTS

    # One H200, B4 x T2048 = 8192 tokens a step in 129.7 ms: 8192 · 8,220,192,768 FLOPs / 0.1297 s
    # = 519.2 TFLOP/s of the data sheet's 989.4 dense bf16.
    h200 = [types.SimpleNamespace(device_kind='NVIDIA H200')]
    meter = MFUMeter('llama3', VARIANTS['llama3.2-1b'], 2048, 8192, h200, 'bfloat16')
    assert meter.of(0.1297) == pytest.approx(8192 * 8_220_192_768 / 0.1297 / 989.4e12, rel=1e-12)
    assert round(meter.of(0.1297), 4) == 0.5248
    # Two of them on twice the tokens in the same time: the same MFU.
    two = MFUMeter('llama3', VARIANTS['llama3.2-1b'], 2048, 16384, h200 * 2, 'bfloat16')
    assert two.of(0.1297) == pytest.approx(meter.of(0.1297), rel=1e-12)
    # --peak_tflops wins over the table.
    given = MFUMeter('llama3', VARIANTS['llama3.2-1b'], 2048, 8192, h200, 'bfloat16', 500.0)
    assert given.of(0.1297) == pytest.approx(8192 * 8_220_192_768 / 0.1297 / 500e12, rel=1e-12)


def test_the_summary_gives_the_runs_mfu():
    lines, now = [], [0.0]
    progress = Progress(0, 3, 100, lines.append, clock=lambda: now[0])
    for step, (seconds, mfu) in enumerate([(5.0, 0.01), (1.0, 0.5), (3.0, 0.5 / 3)], 1):
        now[0] += seconds
        progress.step(step, 1.0, seconds, mfu)
    progress.summary([])
    # The two timed steps did 2 × F FLOPs in 4 s at a peak where 1 s is MFU 0.5: 2·0.5/4 = 25%.
    assert '| MFU 25.0% |' in lines[-1]


@pytest.mark.slow
def test_tensorboard_curves_match_the_step_lines_across_a_resume(tmp_path, monkeypatch):
    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, 'wandb', wandb)
    model = tiny_llmc_model(tmp_path / 'model.bin')
    common = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        input_val_bin=random_shard(tmp_path / 'val.bin', seed=1),
        llmc_filepath=model,
        val_loss_every=2,
        val_max_steps=1,
        save_steps=3,
        learning_rate=1e-3,
        lr_schedule='cosine',
        warmup_steps=2,
        peak_tflops=0.5,
        tensorboard_dir=str(tmp_path / 'tb'),
    )
    first = load_config(
        'gpt2',
        num_iteration=6,
        checkpoint_dir=str(tmp_path / 'a'),
        metrics_dir=str(tmp_path / 'ma'),
        wandb_project='curves',
        **common,
    )
    code, _, out_first = train(first)
    assert code == 0, out_first
    # As if the first run had died after step 6 with step 3 its last checkpoint worth keeping.
    second = load_config(
        'gpt2',
        num_iteration=8,
        checkpoint_dir=str(tmp_path / 'b'),
        metrics_dir=str(tmp_path / 'mb'),
        resume_from=str(tmp_path / 'a' / 'checkpoint_step_000003'),
        **common,
    )
    code, _, out_second = train(second)
    assert code == 0, out_second

    printed = {}
    for out, steps in ((out_first, range(1, 4)), (out_second, range(4, 9))):
        for match in STEP_LINE.finditer(out):
            if int(match[1]) in steps:
                printed[int(match[1])] = [float(v) for v in match.groups()[1:]]
    val = {int(m[1]): float(m[2]) for out in (out_first, out_second) for m in VAL_LINE.finditer(out)}
    recorded = {}
    for directory, steps in (('ma', range(1, 4)), ('mb', range(4, 9))):
        for line in (tmp_path / directory / 'metrics.jsonl').read_text().splitlines():
            row = json.loads(line)
            if 'loss' in row and row['step'] in steps:
                recorded[row['step']] = row

    events = EventAccumulator(str(tmp_path / 'tb'))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()['scalars']}
    counts = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}
    # Each step once: the resumed run's purge marker hid the first run's steps 4-6.
    assert counts['train/loss'] == list(range(1, 9))
    assert counts['val/loss'] == [2, 4, 6, 8]
    for step, (loss, lr, ms, tokens_per_s) in printed.items():
        assert scalars['train/loss'][step] == pytest.approx(loss, abs=5e-7)
        assert scalars['train/lr'][step] == pytest.approx(lr, rel=5e-3)
        assert scalars['perf/step_ms'][step] == pytest.approx(ms, abs=_printed_and_float32(ms, 0.01))
        assert scalars['perf/tokens_per_s'][step] == pytest.approx(
            tokens_per_s, abs=_printed_and_float32(tokens_per_s, 1)
        )
        row = recorded[step]
        assert scalars['train/grad_norm'][step] == pytest.approx(row['grad_norm'], rel=1e-6)
        # MFU from the model's shape: FLOPs of the step over its time at 0.5 TFLOP/s on one device.
        flops = gpt2_flops_per_token(llmc_io.load_model(model)[0], first.sequence_length) * 256
        assert row['mfu'] == pytest.approx(flops / (row['step_ms'] / 1e3 * 0.5e12), rel=1e-6)
        assert scalars['perf/mfu'][step] == pytest.approx(row['mfu'], rel=1e-6)
    # The validation loss is a mean in float64 (train/loop.py), so float32 rounds it too.
    assert {s: pytest.approx(v, abs=_printed_and_float32(v, 1e-6)) for s, v in val.items()} == scalars[
        'val/loss'
    ]
    # The first run's step 3; the second run's 6 and its last step (the first run's 6 is purged).
    assert sorted(scalars['checkpoint/save_blocked_s']) == [3, 6, 8]
    assert set(scalars['checkpoint/save_commit_s']) <= {3, 6, 8} and 3 in scalars['checkpoint/save_commit_s']
    assert list(scalars['checkpoint/restore_s']) == [3] and scalars['checkpoint/restore_s'][3] > 0
    (config_text,) = [e for e in events.Tensors('config/text_summary') if e.step == 3]  # the resumed run's
    resumed_from = json.loads(config_text.tensor_proto.string_val[0].decode().replace('\n    ', '\n'))
    assert resumed_from['config']['num_iteration'] == 8 and resumed_from['weights'].endswith('000003')
    assert 'summary: 5 steps (4-8)' in out_second and '| MFU ' in out_second

    (run,) = wandb.runs  # only the first run asked for W&B
    assert run.init['project'] == 'curves' and run.recorded['config']['num_iteration'] == 6 and run.finished
    assert run.step_metric == 'step'
    logged_loss = {values['step']: values['train/loss'] for values in run.logged if 'train/loss' in values}
    assert sorted(logged_loss) == list(range(1, 7))
    assert all(logged_loss[s] == pytest.approx(scalars['train/loss'][s]) for s in (1, 2, 3))


def test_wandb_missing_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    from jaxtrain.checks.config_checks import check_config

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, 'find_spec', lambda name, *a: None if name == 'wandb' else find_spec(name, *a)
    )
    config = load_config('gpt2', wandb_project='p', metrics_dir=str(tmp_path / 'm'))
    with pytest.raises(ValueError) as raised:
        check_config(config)
    assert (
        "wandb_project: expected the wandb package to log to 'p', found it not installed; pip install "
        "wandb (or pip install 'jaxtrain[wandb]'), or drop --wandb_project"
    ) in str(raised.value)
    assert not (tmp_path / 'm').exists()


def test_a_run_that_raises_after_wandb_started_finishes_it_failed(tmp_path, monkeypatch):
    from jaxtrain.train import loop

    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, 'wandb', wandb)

    def refuse(*_, **__):  # as a checkpoint_dir the run may not write to is refused
        raise ValueError('refused')

    monkeypatch.setattr(loop, 'RunSaver', refuse)
    # The small-vocabulary model the other runs here train: its parameters are read from the
    # file, and its optimizer state's program is theirs (a random init of tiny's 50,257-token
    # vocabulary would compile programs of its own).
    config = load_config(
        'gpt2',
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        wandb_project='p',
    )
    with pytest.raises(ValueError, match='refused'):
        train(config)
    (run,) = wandb.runs
    assert run.exit_code == 1


# docs/dashboards.md's table: metrics.jsonl key -> tag.
DOCUMENTED_TAGS = {
    'loss': 'train/loss',
    'lr': 'train/lr',
    'grad_norm': 'train/grad_norm',
    'val_loss': 'val/loss',
    'step_ms': 'perf/step_ms',
    'tokens_per_s': 'perf/tokens_per_s',
    'save_blocked_s': 'checkpoint/save_blocked_s',
    'save_snapshot_s': 'checkpoint/save_snapshot_s',
    'save_commit_s': 'checkpoint/save_commit_s',
    'restore_s': 'checkpoint/restore_s',
}


def wandb_curves(run_root):
    """{tag: {training step: value}} of the offline W&B run under run_root, and its records."""
    from wandb_offline_records import item_values, of_type, wandb_records

    records = wandb_records(run_root)
    curves = {}
    for history in of_type(records, 'history'):
        row = item_values(history.item)
        for tag, value in row.items():
            if not tag.startswith('_') and tag != 'step':
                assert row['step'] not in curves.setdefault(tag, {}), (tag, row)  # each step once
                curves[tag][row['step']] = value
    return curves, records


@pytest.mark.slow
def test_real_wandb_offline_logs_what_metrics_jsonl_holds_across_a_resume(tmp_path, monkeypatch):
    pytest.importorskip('wandb')
    from jaxtrain.checkpoint.layout import CheckpointError
    from wandb_offline_records import item_values, of_type, wandb_records

    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    # The tensorboard test's runs (6 steps, then 4-8 from step 3's checkpoint), so that the
    # train steps compiled for them serve these.
    common = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        input_val_bin=random_shard(tmp_path / 'val.bin', seed=1),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        val_loss_every=2,
        val_max_steps=1,
        save_steps=3,
        learning_rate=1e-3,
        lr_schedule='cosine',
        warmup_steps=2,
        wandb_project='offline-check',
    )
    resume = dict(num_iteration=8, resume_from=str(tmp_path / 'ck1' / 'checkpoint_step_000003'))
    runs = [
        load_config(
            'gpt2',
            num_iteration=6,
            metrics_dir=str(tmp_path / 'm1'),
            checkpoint_dir=str(tmp_path / 'ck1'),
            **common,
        ),
        load_config(
            'gpt2', metrics_dir=str(tmp_path / 'm2'), checkpoint_dir=str(tmp_path / 'ck2'), **resume, **common
        ),
    ]
    for config, first_step in zip(runs, (1, 4)):
        code, _, out = train(config)
        assert code == 0, out
        curves, records = wandb_curves(config.metrics_dir)
        expected = {}
        for line in (Path(config.metrics_dir) / 'metrics.jsonl').read_text().splitlines():
            row = json.loads(line)
            for key, tag in DOCUMENTED_TAGS.items():
                if key in row:
                    expected.setdefault(tag, {})[row['step']] = row[key]
        # Every scalar metrics.jsonl holds, at its step and to the bit, and nothing else: a
        # checkpoint's commit time, recorded after later steps, is there too.
        assert {t: c for t, c in curves.items() if t in expected} == expected
        assert set(curves) - set(expected) <= {'perf/mfu', 'perf/sample_s'}
        assert sorted(curves['train/loss']) == list(range(first_step, config.num_iteration + 1))
        for match in STEP_LINE.finditer(out):
            step, loss, lr = int(match[1]), float(match[2]), float(match[3])
            assert curves['train/loss'][step] == pytest.approx(loss, abs=5e-7)
            assert curves['train/lr'][step] == pytest.approx(lr, rel=5e-3)
        (run,) = of_type(records, 'run')
        assert run.project == 'offline-check'
        config_items = item_values(of_type(records, 'config')[-1].update)
        assert config_items['config']['num_iteration'] == config.num_iteration
        assert config_items['config']['resume_from'] == config.resume_from
        assert [exit.exit_code for exit in of_type(records, 'exit')] == [0]
    assert list(curves['checkpoint/restore_s']) == [3]

    # Refused after W&B started (ck1 holds a step after 3): the W&B run ends, marked failed.
    refused = load_config(
        'gpt2', metrics_dir=str(tmp_path / 'm3'), checkpoint_dir=str(tmp_path / 'ck1'), **resume, **common
    )
    with pytest.raises(CheckpointError):
        train(refused)
    assert [exit.exit_code for exit in of_type(wandb_records(tmp_path / 'm3'), 'exit')] == [1]


def test_real_wandb_marks_a_run_that_raised_failed(tmp_path, monkeypatch):
    pytest.importorskip('wandb')
    from jaxtrain.train.dashboards import Dashboards
    from wandb_offline_records import item_values, of_type, wandb_records

    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    config = load_config('gpt2', wandb_project='p', metrics_dir=str(tmp_path / 'm'))
    dashboards = Dashboards(config, first_step=0)
    dashboards.record({'step': 1, 'loss': 2.5})
    dashboards.close(failed=True)
    records = wandb_records(tmp_path / 'm')
    assert [exit.exit_code for exit in of_type(records, 'exit')] == [1]
    (history,) = of_type(records, 'history')
    assert {k: v for k, v in item_values(history.item).items() if not k.startswith('_')} == {
        'step': 1,
        'train/loss': 2.5,
    }
