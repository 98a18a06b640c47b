"""python -m jaxtrain.ckpt export --format hf on checkpoints written by the trainer's Checkpointer:
the folder reads back (llmc_io.hf, itself checked against the NumPy reference in
tests/llmc/test_llmc_hf.py) to exactly the saved params, for both families; damaged params are
refused before anything is written."""

import dataclasses
import importlib.util
import json
import shutil

import jax

import numpy as np
import orbax.checkpoint as ocp
import pytest
from tiny_models import random_params, tiny_header
from trainer_runs import write_checkpoint

from jaxtrain.tools import ckpt
from llmc_io.hf import load_hf

GPT2 = tiny_header('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16)
LLAMA = tiny_header('llama3', max_seq_len=16, vocab_size=48, ffn_dim_multiplier=1.3, multiple_of=8)


def flat(tree, prefix=''):
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f'{prefix}{key}/') if isinstance(value, dict) else {prefix + key: value})
    return out


@pytest.mark.parametrize('family, header', [('gpt2', GPT2), ('llama3', LLAMA)])
def test_export_hf_reads_back_to_the_saved_params(tmp_path, capsys, family, header):
    params = random_params(header, 0, std=0.3, everywhere=True)
    if family == 'gpt2':
        params['wte']['embedding'][header.vocab_size :] = (
            0  # HF keeps V rows; the padding comes back as zeros
        )
    step_dir = write_checkpoint(tmp_path / 'ck', 5, family, header, params)
    argv = ['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf'), '--check', '--json']
    assert ckpt.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out['hf_class'] == {'gpt2': 'GPT2LMHeadModel', 'llama3': 'LlamaForCausalLM'}[family]
    assert out['check']['max_abs_diff'] < 1e-4 < out['check']['max_abs_logit']  # fp32: only summation order
    back_header, back = load_hf(tmp_path / 'hf')
    assert back_header == header
    expected, found = flat(params), flat(back)
    assert expected.keys() == found.keys()
    assert all(np.array_equal(expected[k], found[k]) for k in expected)
    assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['torch_dtype'] == 'float32'


def test_a_tied_llama_exports_tied_in_bf16_shards(tmp_path, capsys):
    """--dtype bfloat16 --max_shard_size: several shards named as save_pretrained names them, an index
    with total_size, generation_config.json, one tensor for embedding and head, and each tensor the
    bf16 of the checkpoint's (bf16-valued here, so the bytes are the checkpoint's own)."""
    import ml_dtypes
    from safetensors.numpy import load_file

    header = dataclasses.replace(LLAMA, tie_embeddings=True)
    params = random_params(header, 2, std=0.3, everywhere=True)
    params = jax.tree.map(lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32), params)
    step_dir = write_checkpoint(tmp_path / 'ck', 5, 'llama3', header, params)
    argv = ['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf')]
    assert ckpt.main(argv + ['--dtype', 'bfloat16', '--max_shard_size', '3KB', '--check']) == 0
    out = capsys.readouterr().out
    assert 'bfloat16' in out and 'largest logit difference' in out
    folder = tmp_path / 'hf'
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    shards = sorted(set(index['weight_map'].values()))
    assert len(shards) >= 3 and shards == [
        f'model-{i:05d}-of-{len(shards):05d}.safetensors' for i in range(1, len(shards) + 1)
    ]
    tensors = {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
    assert index['metadata']['total_size'] == sum(t.nbytes for t in tensors.values())
    assert (
        'lm_head.weight' not in tensors
        and json.loads((folder / 'config.json').read_text())['tie_word_embeddings']
    )
    assert json.loads((folder / 'generation_config.json').read_text())['eos_token_id'] is None  # vocab 48
    embed = params['wte']['embedding'].astype(ml_dtypes.bfloat16)
    assert tensors['model.embed_tokens.weight'].tobytes() == embed.tobytes()
    down = params['h']['mlp']['c_proj']['kernel'][1].T.astype(ml_dtypes.bfloat16)
    assert tensors['model.layers.1.mlp.down_proj.weight'].tobytes() == down.tobytes()
    back_header, back = load_hf(folder)
    assert back_header == header and all(np.array_equal(flat(params)[k], v) for k, v in flat(back).items())
    other = write_checkpoint(tmp_path / 'other', 5, 'llama3', header, random_params(header, 9, std=0.3))
    assert ckpt.main(['check-hf', str(folder), '--against', str(other)]) == 1  # other weights
    assert 'above --atol 0.05' in capsys.readouterr().out
    # --force into it, now one fp32 file: the shards and the index go (the single file would win).
    assert ckpt.main(argv + ['--force']) == 0
    names = sorted(p.name for p in folder.iterdir())
    assert names == ['config.json', 'generation_config.json', 'model.safetensors']
    assert ckpt.main(argv[:-1] + [str(tmp_path / 'x'), '--max_shard_size', 'big']) == 2
    assert "--max_shard_size: expected a size such as 5GB" in capsys.readouterr().err
    assert (
        ckpt.main(['export', str(step_dir), '--output', str(tmp_path / 'x.bin'), '--dtype', 'bfloat16']) == 2
    )
    assert '--dtype: expected --format hf' in capsys.readouterr().err


def test_damaged_params_are_refused(tmp_path, capsys):
    params = random_params(GPT2, 1, std=0.3, everywhere=True)
    step_dir = write_checkpoint(tmp_path / 'ck', 5, 'gpt2', GPT2, params)
    params['ln_f']['bias'][0] += 1.0
    shutil.rmtree(step_dir / 'params')
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(step_dir / 'params', params)
    checkpointer.wait_until_finished()
    assert ckpt.main(['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf')]) == 2
    refusal = capsys.readouterr().err
    assert f'ckpt export: {step_dir}/params/ln_f/bias: checksum expected ' in refusal
    assert not (tmp_path / 'hf').exists()
    assert (
        ckpt.main(
            ['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf'), '--version', '5']
        )
        == 2
    )
    assert '--version: expected none with --format hf' in capsys.readouterr().err


@pytest.mark.parametrize('kind', ['tokenizer.json', 'tiktoken'])
def test_the_runs_tokenizer_is_written_beside_config_json(tmp_path, capsys, kind):
    import tiktoken
    import tokenizers

    from text_tokenizers import corpus_text, tiktoken_file_from, train_bpe

    source = train_bpe(tmp_path / 'tokenizer.json', 'llama3', vocab_size=LLAMA.vocab_size + 400)
    text = corpus_text(30_000) + ' naïve “quotes” 12345 <|end_of_text|>'
    if kind == 'tiktoken':
        ranks = tiktoken_file_from(source, tmp_path / 'tokenizer.model')
        source = tmp_path / 'tokenizer.model'
        pattern = (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        expected = tiktoken.Encoding(
            't', pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        ).encode_ordinary(text)
    else:
        reference = tokenizers.Tokenizer.from_file(str(source))
        reference.encode_special_tokens = True
        expected = reference.encode(text).ids
    params = random_params(LLAMA, 1, std=0.3, everywhere=True)
    step = write_checkpoint(
        tmp_path / 'run', 2, 'llama3', LLAMA, params, training_config={'tokenizer': str(source)}
    )
    assert ckpt.main(['export', str(step), '--format', 'hf', '--output', str(tmp_path / 'hf')]) == 0
    assert 'tokenizer.json, tokenizer_config.json' in capsys.readouterr().out
    exported = tokenizers.Tokenizer.from_file(str(tmp_path / 'hf' / 'tokenizer.json'))
    exported.encode_special_tokens = True
    assert exported.encode(text).ids == expected
    assert exported.token_to_id('<|end_of_text|>') == (len(ranks) + 1 if kind == 'tiktoken' else 1)
    config = json.loads((tmp_path / 'hf' / 'tokenizer_config.json').read_text())
    assert (config['bos_token'], config['eos_token']) == ('<|begin_of_text|>', '<|end_of_text|>')
    if importlib.util.find_spec('transformers'):  # the optional `hf` extra
        import transformers

        loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
        assert loaded.decode(expected) == text


def test_a_tokenizer_the_run_named_but_gone_is_one_line(tmp_path, capsys):
    step = write_checkpoint(
        tmp_path / 'run',
        2,
        'gpt2',
        GPT2,
        random_params(GPT2, 1, std=0.3, everywhere=True),
        training_config={'tokenizer': '/gone/t.json'},
    )
    assert ckpt.main(['export', str(step), '--format', 'hf', '--output', str(tmp_path / 'hf')]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1
    assert (
        '--tokenizer: /gone/t.json: expected the tokenizer file the run named, found nothing there; '
        'pass --tokenizer with its new path'
    ) in err
    assert not (tmp_path / 'hf').exists()
