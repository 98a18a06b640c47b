"""`llmc_io info | convert` on a malformed Hugging Face folder: one line naming the file and the field,
exit 2, nothing written. Each folder is a good one written by save_hf with one thing spoiled; before,
several gave Python tracebacks ('list' object has no attribute 'get', could not convert string to
float), 'Is a directory', silently wrong models (3 heads over 64 channels) or 'expected -20 bytes'."""

import json
import shutil
import struct

import numpy as np
import pytest

import llmc_io
from llmc_io.__main__ import main
from llmc_io.hf import save_hf

GPT2 = llmc_io.GPT2Header(
    max_seq_len=8, vocab_size=20, padded_vocab_size=32, num_layers=1, num_heads=2, channels=8
)
LLAMA = llmc_io.LLaMA3Header(8, 24, 1, 4, 2, 16, 1.0, 16, 1e-5, 10000.0, False, 4)


def _params(header):
    rng, tree = np.random.default_rng(0), {}
    for name, shape in header.param_shapes().items():
        *parents, leaf = name.split('/')
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = rng.normal(0, 0.3, shape).astype(np.float32)
    return tree


@pytest.fixture(scope='module')
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp('hf')
    save_hf(root / 'gpt2', GPT2, _params(GPT2))
    save_hf(root / 'llama', LLAMA, _params(LLAMA))
    return root


def _config(field, value):
    def spoil(folder):
        config = json.loads((folder / 'config.json').read_text())
        config[field] = value
        (folder / 'config.json').write_text(json.dumps(config))

    return spoil


def _negative_shape(folder):
    path = folder / 'model.safetensors'
    raw = path.read_bytes()
    (size,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8 : 8 + size])
    first = sorted(k for k in header if k != '__metadata__')[0]
    header[first]['shape'] = [-20]
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    path.write_bytes(struct.pack('<Q', len(text)) + text + raw[8 + size :])


def _config_list(folder):
    (folder / 'config.json').write_text('[1, 2]')


def _no_config(folder):
    (folder / 'config.json').unlink()


CASES = {
    'config a list': ('gpt2', _config_list, 'config.json: top level: expected a JSON object'),
    'no config.json': ('gpt2', _no_config, "expected an HF model folder's config.json, found none"),
    'heads not dividing': ('gpt2', _config('n_head', 3), 'n_head: expected a divisor of n_embd 8'),
    'bool for an int': ('gpt2', _config('n_positions', True), 'n_positions: expected a positive integer'),
    'negative shape': ('gpt2', _negative_shape, 'shape and data_offsets of integers >= 0'),
    'text for a float': ('llama', _config('rope_theta', 'abc'), 'rope_theta: expected a positive number'),
    'rope_scaling a list': ('llama', _config('rope_scaling', [1]), 'rope_scaling: expected null or'),
    'no kv heads': ('llama', _config('num_key_value_heads', 0), 'num_key_value_heads: expected a positive'),
    'llmc_header a list': ('llama', _config('llmc_header', [4]), 'llmc_header: expected an object'),
    'biases': ('llama', _config('attention_bias', True), 'attention_bias: expected false (jaxtrain'),
    'yarn RoPE': ('llama', _config('rope_scaling', {'rope_type': 'yarn'}), 'rope_type llama3'),
    'sliding window': ('llama', _config('sliding_window', 4096), 'sliding_window: expected null'),
    'head_dim apart': ('llama', _config('head_dim', 8), 'head_dim: expected null or 4'),
}


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('command', ['info', 'convert'])
def test_a_malformed_folder_is_one_line(good, tmp_path, capsys, case, command):
    family, spoil, expected = CASES[case]
    folder = tmp_path / 'folder'
    shutil.copytree(good / family, folder)
    spoil(folder)
    argv = [command, str(folder)] + ([str(tmp_path / 'out.bin')] if command == 'convert' else [])
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'error: {folder}') and expected in lines[0], err
    assert not (tmp_path / 'out.bin').exists()
