"""Hugging Face folders as the Hub holds them, written here with the `safetensors` library itself:
one file or shards with model.safetensors.index.json, F32, BF16 or F16, tied or untied heads,
Llama-3.2's rope_scaling. llmc_io.hf reads each; the jaxtrain model on what it read gives the logits
of an independent NumPy forward over the folder's own tensors and config.json (HF names, nn.Linear
layouts, rotate_half RoPE: tests/numpy_reference.py's hf_llama_logits)."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxtrain.models import FAMILIES
from jaxtrain.models.setup import config_from_header
from llmc_io.__main__ import main as llmc_main
from llmc_io.hf import load_hf
from llmc_io.hf_config import rope_scaling

CONFIG = {
    'architectures': ['LlamaForCausalLM'],
    'model_type': 'llama',
    'vocab_size': 48,
    'hidden_size': 32,
    'intermediate_size': 40,
    'num_hidden_layers': 2,
    'num_attention_heads': 4,
    'num_key_value_heads': 2,
    'head_dim': 8,
    'hidden_act': 'silu',
    'max_position_embeddings': 16,
    'rms_norm_eps': 1e-5,
    'rope_theta': 10000.0,
    # Llama-3.2's type and factor over a short original context: at 8 positions, head_dim 8's four
    # frequencies are kept, blended and divided (wavelengths 6, 63, 628 and 6283 against 16..64).
    'rope_scaling': {
        'rope_type': 'llama3',
        'factor': 32.0,
        'low_freq_factor': 1.0,
        'high_freq_factor': 4.0,
        'original_max_position_embeddings': 64,
    },
    'attention_bias': False,
    'mlp_bias': False,
    'tie_word_embeddings': True,
    'torch_dtype': 'bfloat16',
}
TOKENS = np.array([[1, 7, 3, 9, 0, 22, 5, 41], [40, 2, 2, 8, 19, 4, 30, 11]])
NUMPY_DTYPES = {'F32': np.float32, 'BF16': ml_dtypes.bfloat16, 'F16': np.float16}


def hf_tensors(config, dtype, seed=0):
    """Random tensors with LlamaForCausalLM's names and (out, in) shapes."""
    rng = np.random.default_rng(seed)
    C, F, V = config['hidden_size'], config['intermediate_size'], config['vocab_size']
    kv = config['num_key_value_heads'] * config['head_dim']
    shapes = {'model.embed_tokens.weight': (V, C), 'model.norm.weight': (C,)}
    for i in range(config['num_hidden_layers']):
        p = f'model.layers.{i}.'
        shapes.update(
            {
                p + 'input_layernorm.weight': (C,),
                p + 'post_attention_layernorm.weight': (C,),
                p + 'self_attn.q_proj.weight': (C, C),
                p + 'self_attn.k_proj.weight': (kv, C),
                p + 'self_attn.v_proj.weight': (kv, C),
                p + 'self_attn.o_proj.weight': (C, C),
                p + 'mlp.gate_proj.weight': (F, C),
                p + 'mlp.up_proj.weight': (F, C),
                p + 'mlp.down_proj.weight': (C, F),
            }
        )
    if not config['tie_word_embeddings']:
        shapes['lm_head.weight'] = (V, C)
    return {n: rng.normal(0, 0.3, s).astype(NUMPY_DTYPES[dtype]) for n, s in shapes.items()}


def write_folder(folder, config, tensors, shards):
    """config.json and the tensors in `shards` files (1: model.safetensors), by the library."""
    folder.mkdir()
    (folder / 'config.json').write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
        return
    names, weight_map = list(tensors), {}
    for k in range(shards):
        file_name = f'model-{k + 1:05d}-of-{shards:05d}.safetensors'
        part = names[k::shards]
        save_file({n: tensors[n] for n in part}, str(folder / file_name), metadata={'format': 'pt'})
        weight_map.update(dict.fromkeys(part, file_name))
    index = {'metadata': {'total_size': sum(t.nbytes for t in tensors.values())}, 'weight_map': weight_map}
    (folder / 'model.safetensors.index.json').write_text(json.dumps(index))


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
