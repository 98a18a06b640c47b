"""InfiniTrain's harness command lines (scripts/test_config.json through
scripts/run_models_and_profile.bash, b24d92f; the rows are in upstream_test_config.py) run
through our trainer with the program name changed: `./gpt2` -> `python -m jaxtrain.main
--config=configs/gpt2.py:infinitrain` (`./llama3` likewise). What else changes, so that CI
can afford it: the data paths name a tiny model file and shard; `--device cuda` becomes
`--device cpu` where there is no GPU; each run is a few steps (num_iteration 2; the
checkpoint rows' 50 steps, save_interval 10 and resume step 30 are divided by 10).

A row either trains, or, where it asks for a combination not built yet (pipeline stages
with sequence parallelism, ZeRO or LoRA), stops on one line saying "not supported yet".
The pipeline rows get an 8-layer model, so that their stages divide the layers. The logs are
written where run_and_log puts them (LOG_DIR/<tag>/<model>_<id>.log) and read with the
parsing rules of upstream's scripts/compare_loss.py, compare_tps.py and compare_utils.py
(re-implemented below): every step is found, and the resumed checkpoint run agrees with the
run it resumed from within compare_loss's thresholds.
"""

import re
import shlex
from pathlib import Path

import jax
import pytest

import upstream_test_config as upstream
from cli_runs import run_cli
from trainer_runs import random_shard, tiny_llmc_model

# --- upstream's parsing rules (scripts/*.py at b24d92f) ---------------------------------
LOSS = re.compile(r'step\s+(\d+)/\d+\s+\|\s+train loss\s+([\d.]+)')  # compare_loss.parse_log
TPS = re.compile(r'step\s+(\d+)/\d+.*?\|\s+(\d+)\s+tok/s')  # compare_tps.parse_log
THRESHOLD = {'fp32': 1e-5, 'bfloat16': 1e-2}  # compare_loss --threshold-fp32/--threshold-bf16


def parse(pattern, path) -> dict[int, float]:
    """{step: value}, a later line for the same step replacing an earlier one."""
    return {int(m.group(1)): float(m.group(2)) for m in map(pattern.search, open(path)) if m}


def collect_log_files(base: Path) -> dict[str, Path]:
    """compare_utils.collect_log_files: *.log under base by basename, builds/ctest/profile out."""
    found = {}
    for path in base.rglob('*.log'):
        if path.name.startswith(('build', 'ctest_')) or path.name.endswith('_profile.log'):
            continue
        assert path.name not in found, f'duplicate log basename {path.name}'
        found[path.name] = path
    return found


def dtype_of(name: str) -> str:
    return 'bfloat16' if '_bfloat16' in name else 'fp32'  # compare_loss.get_dtype_from_filename


# --- upstream's command line (run_models_and_profile.bash) ------------------------------


def _namespaced(path: str, model: str, mode: str) -> str:
    """args_string_for_test's namespaced_path: --save/--load move under <model>/<mode>."""
    match = re.match(r'^(?P<prefix>.*)/(?P<step>checkpoint_step_[0-9]+(?:/.*)?)$', path)
    if match:
        return f"{match['prefix']}/{model}/{mode}/{match['step']}"
    return f'{path}/{model}/{mode}'


def _tostring(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)  # jq's tostring


def upstream_command(model: str, args: dict) -> str:
    args = dict(args)
    run_mode = 'resume' if 'load' in args else 'no_resume'
    source_mode = 'no_resume' if 'no_resume' in args.get('load', '') else 'resume'
    if 'save' in args:
        args['save'] = _namespaced(args['save'], model, run_mode)
    if 'load' in args:
        args['load'] = _namespaced(args['load'], model, source_mode)
    text = ' '.join(f'--{key} {_tostring(value)}' for key, value in args.items())
    text = text.replace('@CKPT_ROOT_DIR@', upstream.VARIABLES['CKPT_ROOT_DIR'])
    family = model.upper()
    return upstream.COMMAND_TEMPLATE.format(
        prefix='',
        model=model,
        input_bin=upstream.VARIABLES[f'{family}_INPUT_BIN'],
        llmc_filepath=upstream.VARIABLES[f'{family}_LLMC_FILEPATH'],
        args=text,
    )


def shrink(args: dict) -> dict:
    """A few steps: 2, or a tenth of the checkpoint rows' schedule (50/10/30 -> 5/1/3)."""
    args = dict(args)
    if 'save_interval' in args:
        args['num_iteration'] //= 10
        args['save_interval'] //= 10
        if 'load' in args:
            step = int(re.search(r'checkpoint_step_(\d+)', args['load'])[1]) // 10
            args['load'] = re.sub(r'checkpoint_step_\d+', f'checkpoint_step_{step:06d}', args['load'])
    else:
        args['num_iteration'] = 2
    return args


def ours(command: str, files: dict, ckpt_root: Path) -> tuple[str, list[str]]:
    """(config, argv) for run_cli: the program name swapped, the data paths substituted."""
    words = shlex.split(command)
    model = words[0].removeprefix('./')
    family = model.upper()
    deep = '_deep' if '--pipeline_parallel' in words else ''
    swap = {
        upstream.VARIABLES[f'{family}_INPUT_BIN']: files[f'{model}_shard'],
        upstream.VARIABLES[f'{family}_LLMC_FILEPATH']: files[f'{model}{deep}_model'],
    }
    root = upstream.VARIABLES['CKPT_ROOT_DIR']
    argv = [swap.get(word, word.replace(root, str(ckpt_root))) for word in words[1:]]
    if jax.default_backend() != 'gpu':
        argv[argv.index('--device') + 1] = 'cpu'
    return f'configs/{model}.py:infinitrain', argv


def refusal_expected(args: dict) -> str | None:
    """The flag a row must be refused for (the first in our flag table's order), or None."""
    asks = {
        'sequence_parallel': args.get('sequence_parallel', False),
        'pipeline_parallel': args.get('pipeline_parallel', 1) > 1,
        'virtual_pipeline_parallel': args.get('virtual_pipeline_parallel', 1) > 1,
        'lora_rank': args.get('lora_rank', 0) > 0,
        'lora_alpha': args.get('lora_alpha', 16.0) != 16.0,
        'lora_target_modules': 'lora_target_modules' in args,
    }
    from jaxtrain.config import infinitrain_flags

    # Only flags that are still "later" here are refused (a key built since then runs).
    later = set(infinitrain_flags.alias_names())
    refused = [name for name, asked in asks.items() if asked and name in later]
    if not refused:
        pipelined = args.get('pipeline_parallel', 1) > 1
        combined = (
            args.get('sequence_parallel') or args.get('zero_stage', 0) > 0 or args.get('lora_rank', 0) > 0
        )
        # train/setup.py: the pipeline schedule does not combine with these yet.
        return 'pipeline_parallel' if pipelined and combined else None
    order = [f.name for f in infinitrain_flags.UPSTREAM]
    return min(refused, key=order.index)


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('harness')
    return {
        'gpt2_model': tiny_llmc_model(root / 'gpt2.bin'),
        'llama3_model': tiny_llmc_model(root / 'llama3.bin', family='llama3'),
        # 8 layers for the pipeline rows: split over 8, 4 x 2 and 2 x 2 stages and chunks.
        'gpt2_deep_model': tiny_llmc_model(root / 'gpt2_deep.bin', num_layers=8),
        'llama3_deep_model': tiny_llmc_model(root / 'llama3_deep.bin', family='llama3', num_layers=8),
        'gpt2_shard': random_shard(root / 'gpt2_train.bin', num_tokens=60_000),
        'llama3_shard': random_shard(root / 'llama3_train.bin', num_tokens=60_000, kind='llama3'),
    }


def run_rows(rows, models, files, tmp_path) -> Path:
    """Runs every row for every model as run_and_log does; returns LOG_DIR."""
    log_dir, ckpt_root = tmp_path / 'logs', tmp_path / 'ckpt'
    for tag, test_id, args in rows:
        for model in models:
            command = upstream_command(model, shrink(args))
            config, argv = ours(command, files, ckpt_root)
            result = run_cli(*argv, config=config, num_devices=None)
            log = log_dir / tag / f'{model}_{test_id}.log'
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f'[COMMAND] {command}\n{result.out}{result.err}')
            refused = refusal_expected(args)
            if refused:
                assert result.code == 1, f'{log.name}: {result.out}{result.err}'
                assert len(result.error_lines) == 1, result.err
                assert result.error_lines[0].startswith((f'error: --{refused} ', f'error: {refused} ')), (
                    result.err
                )
                assert 'not supported yet' in result.err
                continue
            assert result.code == 0, f'{log.name}: {command}\n{result.err}'
            steps = shrink(args)['num_iteration']
            first = 1
            if '--load' in argv:
                first += int(re.search(r'checkpoint_step_(\d+)', argv[argv.index('--load') + 1])[1])
            assert sorted(parse(LOSS, log)) == list(range(first, steps + 1)), log.read_text()
            tps = parse(TPS, log)
            assert sorted(tps) == list(range(first, steps + 1)) and all(v > 0 for v in tps.values())
    return log_dir


def check_resumed_runs_agree(log_dir: Path):
    """compare_loss's rule between each resumed run and the run it resumed: every shared
    step within the dtype's threshold."""
    logs = collect_log_files(log_dir)
    pairs = []
    for name in logs:
        if name.endswith('_resume.log') and not name.endswith('_no_resume.log'):
            stem = name.removesuffix('_resume.log')
            # ckpt_resume resumes ckpt_no_resume; ckpt_bfloat16_resume resumes ckpt_bfloat16.
            pairs += [(base, name) for base in (f'{stem}_no_resume.log', f'{stem}.log') if base in logs]
    pairs = [(base, name) for base, name in pairs if parse(LOSS, logs[name])]  # refused rows: no steps
    assert pairs
    for base, test in pairs:
        a, b = parse(LOSS, logs[base]), parse(LOSS, logs[test])
        shared = sorted(set(a) & set(b))
        assert shared, (base, test)
        for step in shared:
            assert abs(a[step] - b[step]) <= THRESHOLD[dtype_of(test)], (base, test, step, a[step], b[step])


def test_upstream_command_is_built_as_the_harness_builds_it():
    args = dict(upstream.TEST_GROUPS[-1][2])
    command = upstream_command('gpt2', args)
    assert command.startswith(
        './gpt2 --input_bin /data1/shared/InfiniTrain-dev/data/llmc/gpt2/tinyshakespeare/'
        'tiny_shakespeare_train.bin --llmc_filepath /data1/shared/InfiniTrain-dev/data/llmc/gpt2/'
        'gpt2_124M.bin --device cuda --nthread_per_process 8'
    )
    assert '--load /data1/ckpt/3d_ddp2_tp2_pp2_no_resume/gpt2/no_resume/checkpoint_step_000030' in command
    assert '--save /data1/ckpt/3d_tp2_pp2_resume/gpt2/resume --save_optimizer_state true' in command
    assert len(upstream.TEST_GROUPS) == 52


FAST_IDS = {'ckpt_no_resume', 'ckpt_resume'}  # basic 1's command: test_infinitrain_crosscheck.py


def test_harness_rows_are_refused_on_one_line(files, tmp_path):
    """Every row that is refused (cheap: nothing is built); the rows that train:
    test_the_checkpoint_rows_run_and_resume, and every one in test_every_harness_row_through_both_models."""
    refused = [row for row in upstream.TEST_GROUPS if refusal_expected(row[2])]
    assert refused
    run_rows(refused, ['gpt2', 'llama3'], files, tmp_path)


@pytest.mark.slow  # two trainings
def test_the_checkpoint_rows_run_and_resume(files, tmp_path):
    """The GPT-2 runs of the checkpoint pair: saved as the harness keeps them, resumed, in agreement."""
    fast = [row for row in upstream.TEST_GROUPS if row[1] in FAST_IDS and not refusal_expected(row[2])]
    log_dir = run_rows(fast, ['gpt2'], files, tmp_path)
    check_resumed_runs_agree(log_dir)
    saved = sorted(p.name for p in (tmp_path / 'ckpt' / 'no_resume' / 'gpt2' / 'no_resume').iterdir())
    assert saved == ['checkpoint_step_000003', 'checkpoint_step_000004', 'checkpoint_step_000005']  # keep 3
    log = (log_dir / 'checkpoint' / 'gpt2_ckpt_resume.log').read_text()
    assert '[CKPT] Load done: global_step=3, consumed_batches =3, last_lr=0.0001' in log
    assert log.count('[CKPT] Save begin:') == 2 and log.count('[CKPT] Save done:') == 2


@pytest.mark.heavy  # about 5 minutes on 2 cores: every row, both models
def test_every_harness_row_through_both_models(files, tmp_path):
    rows = [row for row in upstream.TEST_GROUPS if not refusal_expected(row[2])]
    check_resumed_runs_agree(run_rows(rows, ['gpt2', 'llama3'], files, tmp_path))
