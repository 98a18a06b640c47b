"""--init_from: weights only, from an Orbax step or root, an InfiniTrain step, an HF folder; a
fresh optimizer, schedule and data position; a model that does not fit is refused in one line
that names both models.

Run A trains the tiny GPT-2 and saves. Run B starts from A's weights: its first loss must be
the NumPy reference's loss of A's saved params (tests/numpy_reference.py) on the stream's first
batch (a fresh data position, not A's), and with learning rate 0 B saves A's weights unchanged."""

import subprocess
import sys

import numpy as np
import pytest

import llmc_io
import numpy_reference as ref
from llmc_io.llmc_state import LLMCState, tree_to_flat, write_state
from hf_folders import CONFIG as HF_CONFIG
from hf_folders import hf_tensors, write_folder
from jaxtrain.tools import ckpt
from trainer_runs import REPO, load_config, random_shard, restore_params, train

T, B = 16, 2


def _first_loss(params, tokens):
    """Mean cross-entropy of the reference GPT-2 on the stream's first window (llm.c's batch 0)."""
    x = tokens[: B * T].reshape(B, T)
    y = tokens[1 : B * T + 1].reshape(B, T)
    logits = ref.gpt2_logits(params, 4, x)[..., :50257]
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], -1).mean())


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp('init_from')
    shard = random_shard(root / 'train.bin', vocab=50257)
    common = dict(
        input_bin=shard, sequence_length=T, batch_size=B, total_batch_size=B * T, learning_rate=1e-2
    )
    for fmt in ('orbax', 'infinitrain'):
        code, _, out = train(
            load_config(
                'gpt2',
                num_iteration=3,
                save_steps=3,
                checkpoint_format=fmt,
                checkpoint_dir=str(root / fmt),
                **common,
            )
        )
        assert code == 0, out
    tokens = np.fromfile(shard, '<u2', offset=1024).astype(np.int64)
    return root, common, tokens, restore_params(root / 'orbax' / 'checkpoint_step_000003')


def _start_from(root, common, source, name, family='gpt2', **overrides):
    config = load_config(
        family,
        num_iteration=1,
        save_steps=1,
        checkpoint_dir=str(root / name),
        metrics_dir=str(root / f'{name}_m'),
        init_from=str(source),
        **{**common, **overrides},
    )
    code, losses, out = train(config)
    assert code == 0, out
    return losses, out


@pytest.mark.slow
@pytest.mark.parametrize('source', ['orbax step', 'orbax root', 'infinitrain', 'hf', 'llmc run'])
def test_weights_only_from_any_kind(trained, source, capsys):
    import jax

    root, common, tokens, params = trained
    params = jax.tree.map(np.asarray, params)
    path = {
        'orbax step': root / 'orbax' / 'checkpoint_step_000003',
        'orbax root': root / 'orbax',
        'infinitrain': root / 'infinitrain' / 'checkpoint_step_000003',
        'hf': root / 'hf',
        'llmc run': root / 'llmc_run',
    }[source]
    if source == 'llmc run' and not path.exists():  # train_gpt2cu's layout: model_, state_, DONE_%08d
        path.mkdir()
        step3 = str(root / 'orbax' / 'checkpoint_step_000003')
        assert ckpt.main(['export', step3, '--output', str(path / 'model_00000003.bin')]) == 0
        header, weights = llmc_io.load_model(path / 'model_00000003.bin')
        master = tree_to_flat(path, weights, header)  # its master weights: the model's own values
        zeros = np.zeros_like(master)
        write_state(path / 'state_00000003_00000.bin', LLMCState(step=3, m=zeros, v=zeros, master=master))
        (path / 'DONE_00000003').touch()
    if source == 'hf' and not path.exists():
        assert (
            ckpt.main(
                [
                    'export',
                    str(root / 'orbax' / 'checkpoint_step_000003'),
                    '--format',
                    'hf',
                    '--output',
                    str(path),
                ]
            )
            == 0
        )
    name = 'from_' + source.replace(' ', '_')
    losses, out = _start_from(root, common, path, name, learning_rate=0.0)
    assert 'weights only (--init_from: fresh optimizer, schedule and data position)' in out
    # Step 1 of a fresh run, on the stream's first batch, with A's weights.
    assert list(losses) == [1]
    assert losses[1] == pytest.approx(_first_loss(params, tokens), abs=2e-4)
    saved = jax.tree.map(np.asarray, restore_params(root / name / 'checkpoint_step_000001'))
    vocab = 50257  # an HF or InfiniTrain copy holds V rows of wte; the padding rows start at zero
    np.testing.assert_array_equal(saved['wte']['embedding'][:vocab], params['wte']['embedding'][:vocab])
    flat_saved = jax.tree_util.tree_leaves_with_path(saved)
    flat_params = dict(jax.tree_util.tree_leaves_with_path(params))
    for key, leaf in flat_saved:
        if 'wte' not in jax.tree_util.keystr(key):
            np.testing.assert_array_equal(leaf, flat_params[key], err_msg=jax.tree_util.keystr(key))


@pytest.mark.slow
def test_a_model_that_does_not_fit_is_refused_in_one_line_naming_both_models(trained, tmp_path):
    root, common, _, _ = trained
    config = load_config('gpt2', 'small', num_iteration=1, init_from=str(root / 'orbax'), **common)
    with pytest.raises(Exception) as raised:
        train(config)
    message = str(raised.value)
    step = root / 'orbax' / 'checkpoint_step_000003'
    # The source was trained as 'tiny' (load_config's default variant); 'small' differs in every tensor.
    assert message.startswith(
        f"init_from: checkpoint {step} holds gpt2 model 'tiny', this run's --model is 'small' ("
    )
    assert message.endswith('; pass --model tiny') and '\n' not in message and len(message) < 400
    assert 'tensors differ, first ' in message
    # An InfiniTrain step records no model config: its tensors' shapes name the variant.
    step = root / 'infinitrain' / 'checkpoint_step_000003'
    config = load_config('gpt2', 'small', num_iteration=1, init_from=str(step), **common)
    with pytest.raises(Exception) as raised:
        train(config)
    assert f"{step} (infinitrain) holds gpt2 model 'tiny', this run's --model is 'small' (" in str(
        raised.value
    )


@pytest.mark.slow
@pytest.mark.parametrize('verbose', [False, True])
def test_the_trainer_keeps_orbaxs_warnings_for_verbose(trained, verbose):
    """Reading an Orbax step's params logs absl's `Metadata file does not exist` warning (the trainer
    saves items without their own metadata file); `python -m jaxtrain.main` shows it with --verbose
    only. The command stops at the model check, after reading the weights and before compiling."""
    root, common, _, _ = trained
    command = [sys.executable, '-m', 'jaxtrain.main', '--config=configs/gpt2.py', '--model', 'small']
    command += ['--init_from', str(root / 'orbax'), '--input_bin', common['input_bin']]
    result = subprocess.run(
        command + (['--verbose'] if verbose else []), cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert ('Metadata file does not exist' in result.stderr) == verbose, result.stderr
    if not verbose:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "holds gpt2 model 'tiny'" in lines[0], result.stderr


def test_init_from_and_llmc_filepath_together_are_refused():
    from jaxtrain.checks.config_checks import check_config

    with pytest.raises(ValueError, match='init_from: expected one source of initial weights, found both'):
        check_config(load_config('gpt2', init_from='a', llmc_filepath='b.bin'))


@pytest.mark.slow
def test_a_sharded_bf16_tied_llama_folder_sets_the_model(tmp_path):
    """--init_from alone with configs/llama3.py: config.json sets the model (tied, Llama-3.2's rope
    scaling, a vocabulary of 48), and step 1's loss is the NumPy HF forward's on the first batch."""
    import jax

    tensors = hf_tensors(HF_CONFIG, 'BF16', seed=3)
    write_folder(tmp_path / 'hf', HF_CONFIG, tensors, 3)
    shard = random_shard(tmp_path / 'train.bin', vocab=48, kind='llama3')
    common = dict(input_bin=shard, sequence_length=T, batch_size=B, total_batch_size=B * T)
    losses, out = _start_from(tmp_path, common, tmp_path / 'hf', 'run', family='llama3', learning_rate=0.0)
    tokens = np.fromfile(shard, '<u4', offset=1024).astype(np.int64)
    x, y = tokens[: B * T].reshape(B, T), tokens[1 : B * T + 1].reshape(B, T)
    expected = ref.cross_entropy(ref.hf_llama_logits(tensors, HF_CONFIG, x), y, 48)
    assert losses[1] == pytest.approx(expected, abs=2e-4)
    saved = jax.tree.map(np.asarray, restore_params(tmp_path / 'run' / 'checkpoint_step_000001'))
    assert 'lm_head' not in saved  # trained tied: one tensor
    # Its bf16 export at a small shard size: several shards, every tensor the folder's own bytes.
    step1 = str(tmp_path / 'run' / 'checkpoint_step_000001')
    export = ['export', step1, '--format', 'hf', '--output', str(tmp_path / 'out'), '--dtype', 'bfloat16']
    assert ckpt.main(export + ['--max_shard_size', '4KB']) == 0
    from safetensors.numpy import load_file

    shards = sorted((tmp_path / 'out').glob('model-*-of-*.safetensors'))
    exported = {k: v for shard in shards for k, v in load_file(str(shard)).items()}
    assert len(shards) > 2 and exported.keys() == tensors.keys()
    assert all(exported[k].tobytes() == tensors[k].tobytes() for k in tensors)


def test_a_model_flag_contradicting_the_folder_is_one_line(tmp_path, monkeypatch):
    from jaxtrain.checks.config_checks import check_config

    write_folder(tmp_path / 'hf', HF_CONFIG, hf_tensors(HF_CONFIG, 'F32'), 1)
    monkeypatch.setattr('sys.argv', ['jaxtrain', '--config.model=small'])
    with pytest.raises(ValueError) as raised:
        check_config(load_config('llama3', 'small', init_from=str(tmp_path / 'hf')))
    message = str(raised.value)
    assert message.startswith('model: --model small (8 layers, 512 channels') and '\n' not in message
    assert f'contradicts --init_from {tmp_path / "hf"}' in message and '(2 layers, 32 channels' in message
    untied = {**HF_CONFIG, 'tie_word_embeddings': False}
    write_folder(tmp_path / 'untied', untied, hf_tensors(untied, 'F32'), 1)
    monkeypatch.setattr('sys.argv', ['jaxtrain'])
    with pytest.raises(
        ValueError, match='tie_embeddings: expected a named --model to tie, found --init_from'
    ):
        check_config(load_config('llama3', init_from=str(tmp_path / 'untied'), tie_embeddings=True))
