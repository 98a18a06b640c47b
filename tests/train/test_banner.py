"""The banner names where the weights come from: the random init (with its seed) or the
llm.c file on a fresh start, the checkpoint after a resume; it names the optimizer, its betas,
weight decay and schedule; config.json beside metrics.jsonl records the whole resolved run; a
run that pinned host memory for its saves says so once among its start lines."""

import json

from jaxtrain.checkpoint import layout
from jaxtrain.checkpoint import manager as ckpt_manager
from trainer_runs import load_config, random_shard, tiny_llmc_model, train


def _model_line(out: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith('model: ')]
    return line


def test_banner_names_the_checkpoint_after_a_resume(tmp_path):
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        checkpoint_dir=str(tmp_path / 'ck'),
    )
    code, _, out = train(load_config('gpt2', num_iteration=1, save_steps=1, **files))
    assert code == 0, out
    assert _model_line(out).endswith(f"weights: llm.c file {files['llmc_filepath']}")
    assert 'saves: pinned' not in out  # a CPU run pins nothing
    step_dir = (tmp_path / 'ck').absolute() / layout.step_dir_name(1)
    code, _, out = train(load_config('gpt2', num_iteration=2, save_steps=1, resume_from='latest', **files))
    assert code == 0, out
    line = _model_line(out)
    assert line.endswith(f'weights: checkpoint {step_dir}'), line
    assert 'random init' not in line and files['llmc_filepath'] not in line


def test_a_run_that_pinned_memory_for_its_saves_says_so_once(tmp_path, monkeypatch):
    """Where Checkpointer.prepare pinned host memory (a GPU: 0.72 s here, given), the run prints
    what and how long among its start lines, before step 1."""
    monkeypatch.setattr(ckpt_manager, 'grow_pinned_host_pool', lambda tree: 0.72)
    files = dict(
        input_bin=random_shard(tmp_path / 'train.bin'),
        llmc_filepath=tiny_llmc_model(tmp_path / 'model.bin'),
        checkpoint_dir=str(tmp_path / 'ck'),
    )
    code, _, out = train(load_config('gpt2', num_iteration=2, save_steps=1, **files))
    assert code == 0, out
    lines = out.splitlines()
    [pinned] = [i for i, line in enumerate(lines) if line.startswith('saves: pinned ')]
    assert lines[pinned].endswith(' GiB of host memory for checkpoint copies in 0.72 s'), lines[pinned]
    first_step = next(i for i, line in enumerate(lines) if line.startswith('step '))
    assert pinned < first_step


def test_banner_names_the_seed_of_a_random_init(tmp_path):
    config = load_config('gpt2', num_iteration=0, seed=7, input_bin=random_shard(tmp_path / 'train.bin'))
    config.model = 'tiny'
    code, _, out = train(config)
    assert code == 0, out
    assert _model_line(out).endswith('weights: random init (seed 7)')


def test_banner_names_the_optimizer_and_config_json_records_the_run(tmp_path):
    metrics = tmp_path / 'm'
    config = load_config(
        'gpt2', num_iteration=1, input_bin=random_shard(tmp_path / 'train.bin'), metrics_dir=str(metrics),
        beta2=0.99, weight_decay=0.1, grad_clip=1.0, lr_schedule='cosine', warmup_steps=2, min_lr_ratio=0.1,
        learning_rate=3e-4,
    )  # fmt: skip
    code, _, out = train(config)
    assert code == 0, out
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
    from jaxtrain.train.banner import optimizer_line

    sgd = load_config('gpt2', 'infinitrain')
    assert optimizer_line(sgd) == 'optimizer: sgd | lr 1.00e-04, constant | no weight decay | no grad clip'
    theirs = load_config(
        'llama3', 'infinitrain', lr_decay_style='cosine', lr_warmup_iters=3, lr_warmup_init=1e-6, min_lr=1e-6
    )
    assert optimizer_line(theirs) == (
        "optimizer: adam | lr 1.00e-05, InfiniTrain's cosine, warmup 3 steps from 1.00e-06 "
        'to min_lr 1.00e-06 at step 10 | β1 0.9, β2 0.999, eps 1e-08 | no weight decay | no grad clip'
    )
