"""python -m jaxtrain.ckpt export --format hf on checkpoints written by the trainer's Checkpointer:
the folder reads back (llmc_io.hf, itself checked against the NumPy reference in
tests/llmc/test_llmc_hf.py) to exactly the saved params, for both families; damaged params are
refused before anything is written."""

import json
import shutil

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
    assert ckpt.main(['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf')]) == 0
    out = capsys.readouterr().out
    assert {'gpt2': 'GPT2LMHeadModel', 'llama3': 'LlamaForCausalLM'}[family] in out
    back_header, back = load_hf(tmp_path / 'hf')
    assert back_header == header
    expected, found = flat(params), flat(back)
    assert expected.keys() == found.keys()
    assert all(np.array_equal(expected[k], found[k]) for k in expected)
    assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['torch_dtype'] == 'float32'


def test_damaged_params_are_refused(tmp_path, capsys):
    params = random_params(GPT2, 1, std=0.3, everywhere=True)
    step_dir = write_checkpoint(tmp_path / 'ck', 5, 'gpt2', GPT2, params)
    params['ln_f']['bias'][0] += 1.0
    shutil.rmtree(step_dir / 'params')
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(step_dir / 'params', params)
    checkpointer.wait_until_finished()
    assert ckpt.main(['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf')]) == 2
    assert 'refusing to export params that fail verification' in capsys.readouterr().err
    assert not (tmp_path / 'hf').exists()
    assert (
        ckpt.main(
            ['export', str(step_dir), '--format', 'hf', '--output', str(tmp_path / 'hf'), '--version', '5']
        )
        == 2
    )
    assert '--version: expected none with --format hf' in capsys.readouterr().err
