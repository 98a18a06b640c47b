"""Hugging Face folders as the Hub holds them, written here with the `safetensors` library itself:
one file or shards with model.safetensors.index.json, F32, BF16 or F16, tied or untied heads,
Llama-3.2's rope_scaling. llmc_io.hf reads each; the jaxtrain model on what it read gives the logits
of an independent NumPy forward over the folder's own tensors and config.json (HF names, nn.Linear
layouts, rotate_half RoPE: tests/numpy_reference.py's hf_llama_logits)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from hf_folders import CONFIG, TOKENS, hf_tensors, write_folder

from jaxtrain.models import FAMILIES
from jaxtrain.models.setup import config_from_header
from llmc_io.__main__ import main as llmc_main
from llmc_io.hf import load_hf
from llmc_io.hf.config import rope_scaling


def jaxtrain_logits(header, params):
    model_cls, config_cls, _ = FAMILIES['llama3']
    config = config_from_header(config_cls, header)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))), nnx.Param)
    model = nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))
    return np.asarray(model(jnp.asarray(TOKENS)))


@pytest.mark.parametrize(
    'tied, dtype, shards', [(True, 'BF16', 3), (False, 'F32', 1), (True, 'F16', 1), (False, 'BF16', 2)]
)
def test_a_hub_folder_loads_and_computes_its_logits(tmp_path, tied, dtype, shards):
    config = {**CONFIG, 'tie_word_embeddings': tied}
    tensors = hf_tensors(config, dtype)
    write_folder(tmp_path / 'hf', config, tensors, shards)
    header, params = load_hf(tmp_path / 'hf')
    assert header.tie_embeddings is tied and ('lm_head' in params) is not tied
    assert rope_scaling(header) == (32.0, 1.0, 4.0, 64) and header.ffn_hidden_dim == 40
    # Exact: every value of the folder's dtype is a float32.
    np.testing.assert_array_equal(
        params['wte']['embedding'], tensors['model.embed_tokens.weight'].astype(np.float32)
    )
    if not tied:
        np.testing.assert_array_equal(
            params['lm_head']['kernel'], tensors['lm_head.weight'].astype(np.float32).T
        )
    expected = ref.hf_llama_logits(tensors, config, TOKENS)
    np.testing.assert_allclose(jaxtrain_logits(header, params), expected, atol=1e-4, rtol=1e-4)


def _spoil_index_missing_shard(folder):
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    index['weight_map']['model.norm.weight'] = 'model-00009-of-00009.safetensors'
    (folder / 'model.safetensors.index.json').write_text(json.dumps(index))


def _spoil_index_drops_a_name(folder):
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    del index['weight_map']['model.norm.weight']
    (folder / 'model.safetensors.index.json').write_text(json.dumps(index))


def _spoil_truncated_shard(folder):
    path = folder / 'model-00002-of-00002.safetensors'
    path.write_bytes(path.read_bytes()[:-2])


def _spoil_no_weights(folder):
    for path in folder.glob('*.safetensors*'):
        path.unlink()


SPOILED = {
    'index names a missing shard': (_spoil_index_missing_shard, 'weight_map model.norm.weight: expected'),
    'a shard holds a name the index lacks': (_spoil_index_drops_a_name, 'also holds'),
    'truncated shard': (_spoil_truncated_shard, 'the file is truncated or the header is wrong'),
    'no weight files': (_spoil_no_weights, 'expected model.safetensors or model.safetensors.index.json'),
}


@pytest.mark.parametrize('case', SPOILED)
def test_a_bad_sharded_folder_is_one_line(tmp_path, capsys, case):
    spoil, expected = SPOILED[case]
    write_folder(tmp_path / 'hf', CONFIG, hf_tensors(CONFIG, 'BF16'), 2)
    spoil(tmp_path / 'hf')
    assert llmc_main(['info', str(tmp_path / 'hf')]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'error: {tmp_path / "hf"}') and expected in lines[0], (
        lines
    )


def test_an_unsupported_dtype_is_named(tmp_path, capsys):
    tensors = hf_tensors(CONFIG, 'F32')
    tensors['model.norm.weight'] = tensors['model.norm.weight'].astype(np.float64)
    write_folder(tmp_path / 'hf', CONFIG, tensors, 1)
    assert llmc_main(['info', str(tmp_path / 'hf')]) == 2
    assert 'tensor model.norm.weight: expected dtype (one of F32, BF16, F16)' in capsys.readouterr().err


def test_a_tied_llama_in_an_infinitrain_file_holds_the_tensor_twice(tmp_path):
    """The llm.c / InfiniTrain LLaMA layout has an untied head: the one tensor is written twice."""
    import llmc_io

    tensors = hf_tensors(CONFIG, 'BF16')
    write_folder(tmp_path / 'hf', CONFIG, tensors, 1)
    header, params = load_hf(tmp_path / 'hf')
    assert (
        llmc_main(['convert', str(tmp_path / 'hf'), str(tmp_path / 'm.bin')]) == 2
    )  # factor 32: no flag for it
    flat = {**CONFIG, 'rope_scaling': None}
    write_folder(tmp_path / 'flat', flat, tensors, 1)
    assert llmc_main(['convert', str(tmp_path / 'flat'), str(tmp_path / 'm.bin')]) == 0
    back, stored = llmc_io.load_llama3(str(tmp_path / 'm.bin'))
    assert not back.tie_embeddings
    np.testing.assert_array_equal(stored['lm_head']['kernel'].T, params['wte']['embedding'])
    np.testing.assert_array_equal(stored['wte']['embedding'], params['wte']['embedding'])


def test_check_hf_agrees_with_the_folder_and_its_numpy_forward(tmp_path, capsys):
    """`ckpt check-hf` on a Hub-style folder: its NumPy forward (used where transformers is not
    installed) equals the reference here, and jaxtrain's reading of the folder agrees with it."""
    from jaxtrain.tools import ckpt
    from jaxtrain.tools.hf_check import numpy_logits

    tensors = hf_tensors(CONFIG, 'BF16', seed=1)
    write_folder(tmp_path / 'hf', CONFIG, tensors, 2)
    np.testing.assert_allclose(
        numpy_logits(tmp_path / 'hf', TOKENS),
        ref.hf_llama_logits(tensors, CONFIG, TOKENS),
        rtol=1e-10,
        atol=1e-10,
    )
    assert ckpt.main(['check-hf', str(tmp_path / 'hf'), '--json']) == 0
    result = json.loads(capsys.readouterr().out)
    assert result['passed'] and result['max_abs_diff'] < 1e-4 < result['max_abs_logit']
