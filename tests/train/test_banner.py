"""The banner names where the weights come from: the random init (with its seed) or the
llm.c file on a fresh start, the checkpoint after a resume; it names the optimizer, its betas,
weight decay and schedule; config.json beside metrics.jsonl records the whole resolved run; a
run that pinned host memory for its saves says so once among its start lines."""

import json

import pytest

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint import manager as ckpt_manager
from trainer_runs import load_config, random_shard, tiny_llmc_model, train


def _model_line(out: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith('model: ')]
    return line


@pytest.fixture(scope='module')
def fresh_then_resumed(tmp_path_factory):
    """A 1-step run from the llm.c file saving step 1, then a run resuming it to step 2 where
    Checkpointer.prepare pinned host memory (a GPU: 0.72 s here, given). Returns (the llm.c
    file, step 1's directory, the two runs' stdout)."""
    tmp_path = tmp_path_factory.mktemp('banner')
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        checkpoint_dir=str(tmp_path / 'ck'),
    )
    code, _, fresh = train(load_config('gpt2', num_iteration=1, save_steps=1, **files))
    assert code == 0, fresh
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ckpt_manager, 'grow_pinned_host_pool', lambda tree, limit=None: 0.72)
        config = load_config('gpt2', num_iteration=2, save_steps=1, resume_from='latest', **files)
        code, _, resumed = train(config)
    assert code == 0, resumed
    step_dir = (tmp_path / 'ck').absolute() / layout.step_dir_name(1)
    return files['llmc_filepath'], step_dir, fresh, resumed


@pytest.mark.slow
def test_banner_names_the_checkpoint_after_a_resume(fresh_then_resumed):
    model_file, step_dir, fresh, resumed = fresh_then_resumed
    assert _model_line(fresh).endswith(f'weights: llm.c file {model_file}')
    assert 'saves: pinned' not in fresh  # a CPU run pins nothing
    line = _model_line(resumed)
    assert line.endswith(f'weights: checkpoint {step_dir}'), line
    assert 'random init' not in line and model_file not in line


@pytest.mark.slow
def test_a_run_that_pinned_memory_for_its_saves_says_so_once(fresh_then_resumed):
    """Where Checkpointer.prepare pinned host memory, the run prints what and how long among
    its start lines, before its first step."""
    lines = fresh_then_resumed[-1].splitlines()
    [pinned] = [i for i, line in enumerate(lines) if line.startswith('saves: pinned ')]
    assert lines[pinned].endswith(' GiB of host memory for checkpoint copies in 0.72 s'), lines[pinned]
    first_step = next(i for i, line in enumerate(lines) if line.startswith('step '))
    assert pinned < first_step


@pytest.fixture(scope='module')
def random_init_run(tmp_path_factory):
    """One step of the tiny variant from a random init of seed 7, with AdamW's options and a
    cosine schedule given: its config, stdout and metrics_dir."""
    tmp_path = tmp_path_factory.mktemp('random_init')
    metrics = tmp_path / 'm'
    config = load_config(
        'gpt2', num_iteration=1, seed=7, input_bin=random_shard(tmp_path / 'train.bin'),
        metrics_dir=str(metrics), beta2=0.99, weight_decay=0.1, grad_clip=1.0, lr_schedule='cosine',
        warmup_steps=2, min_lr_ratio=0.1, learning_rate=3e-4,
    )  # fmt: skip
    config.model = 'tiny'
    code, _, out = train(config)
    assert code == 0, out
    return config, out, metrics


@pytest.mark.slow
def test_banner_names_the_seed_of_a_random_init(random_init_run):
    _, out, _ = random_init_run
    assert _model_line(out).endswith('weights: random init (seed 7)')


@pytest.mark.slow
def test_banner_names_the_optimizer_and_config_json_records_the_run(random_init_run):
    config, out, metrics = random_init_run
    [line] = [line for line in out.splitlines() if line.startswith('optimizer: ')]
    assert line == (
        "optimizer: adamw | lr 3.00e-04, cosine, after llm.c's linear warmup of 2 steps to 0.1 x lr at step 1"
        ' | β1 0.9, β2 0.99, eps 1e-08 | weight decay 0.1 (tensors of 2+ dimensions) | grad clip 1'
    )
    assert sorted(p.name for p in metrics.iterdir()) == ['config.json', 'metrics.jsonl']  # no temporary left
    record = json.loads((metrics / 'config.json').read_text())
    assert record['config'] == json.loads(json.dumps(config.to_dict()))  # every key, as resolved
    assert record['model_config']['channels'] == 64 and record['model_family'] == 'gpt2'
    assert record['batch']['tokens_per_step'] == 256
    assert record['optimizer'] == line.removeprefix('optimizer: ')


def test_banner_of_sgd_and_of_infinitrain_s_schedule_spelling(tmp_path):
    from jaxtrain.train.progress import optimizer_line

    sgd = load_config('gpt2', 'infinitrain')
    assert optimizer_line(sgd) == 'optimizer: sgd | lr 1.00e-04, constant | no weight decay | no grad clip'
    theirs = load_config(
        'llama3', 'infinitrain', lr_decay_style='cosine', lr_warmup_iters=3, lr_warmup_init=1e-6, min_lr=1e-6
    )
    assert optimizer_line(theirs) == (
        "optimizer: adam | lr 1.00e-05, InfiniTrain's cosine, warmup 3 steps from 1.00e-06 "
        'to min_lr 1.00e-06 at step 10 | β1 0.9, β2 0.999, eps 1e-08 | no weight decay | no grad clip'
    )
