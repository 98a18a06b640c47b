"""The banner names where the weights come from: the random init (with its seed) or the
llm.c file on a fresh start, the checkpoint after a resume (issue 12 point 4)."""

from jaxtrain.checkpoint import layout
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
    step_dir = (tmp_path / 'ck').absolute() / layout.step_dir_name(1)
    code, _, out = train(load_config('gpt2', num_iteration=2, save_steps=1, resume_from='latest', **files))
    assert code == 0, out
    line = _model_line(out)
    assert line.endswith(f'weights: checkpoint {step_dir}'), line
    assert 'random init' not in line and files['llmc_filepath'] not in line


def test_banner_names_the_seed_of_a_random_init(tmp_path):
    config = load_config('gpt2', num_iteration=0, seed=7, input_bin=random_shard(tmp_path / 'train.bin'))
    config.model = 'tiny'
    code, _, out = train(config)
    assert code == 0, out
    assert _model_line(out).endswith('weights: random init (seed 7)')
