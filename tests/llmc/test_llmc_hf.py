"""Hugging Face export and import (llmc_io.hf), checked from outside:

- the safetensors bytes are read back with a reader written here from the format's README and
  with the `safetensors` package;
- the HF tensors are mapped back to the reference's tree by code written here from transformers'
  conventions (Conv1D (in, out) for GPT-2; nn.Linear (out, in) and convert_llama_weights_to_hf.py's
  `permute` for LLaMA) and run through tests/numpy_reference.py: the logits equal the Flax model's;
- HF -> llm.c (python -m llmc_io convert) gives back the original file byte for byte;
- where transformers is installed, it loads the folder and its logits match (<= 1e-4).
"""

import json
import struct

import ml_dtypes
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from tiny_models import random_params, tiny_header

import llmc_io
from jaxtrain.models import FAMILIES
from llmc_io.__main__ import main as llmc_main
from llmc_io.hf import load_hf, save_hf

# The tiny models with a vocabulary that GPT-2 pads (50 -> 64) and a LLaMA FFN width that
# ffn_dim_multiplier and multiple_of both round.
GPT2 = tiny_header('gpt2', max_seq_len=16, vocab_size=50, padded_vocab_size=64, channels=16)
LLAMA = tiny_header('llama3', max_seq_len=16, vocab_size=48, ffn_dim_multiplier=1.3, multiple_of=8)
TOKENS = np.array([[1, 7, 3, 9, 0, 22, 5, 41], [40, 2, 2, 8, 19, 4, 30, 11]])


def random_tree(header, seed):
    tree = random_params(header, seed, std=0.3, everywhere=True)
    if isinstance(header, llmc_io.GPT2Header):
        tree['wte']['embedding'][header.vocab_size :] = 0  # llm.c's padding rows
    return tree


def read_st(path):
    """safetensors from its README: u64 header length, JSON header, then the raw little-endian data."""
    raw = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop('__metadata__', None)
    data = raw[8 + n :]
    out = {}
    for name, e in header.items():
        assert e['dtype'] == 'F32'
        begin, end = e['data_offsets']
        out[name] = np.frombuffer(data[begin:end], '<f4').reshape(e['shape'])
    return out


def our_logits(family, header, params):
    model_cls, config_cls, _ = FAMILIES[family]
    config = config_cls(**{k: v for k, v in vars(header).items() if k in config_cls.__dataclass_fields__})
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))), nnx.Param)
    model = nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))
    return np.asarray(model(jnp.asarray(TOKENS)))[..., : header.vocab_size]


def hf_permute(w_OxI, n_heads):
    """convert_llama_weights_to_hf.py's permute: Meta's interleaved rows -> HF's rotate_half rows."""
    out_dim, in_dim = w_OxI.shape
    return (
        w_OxI.reshape(n_heads, out_dim // n_heads // 2, 2, in_dim)
        .transpose(0, 2, 1, 3)
        .reshape(out_dim, in_dim)
    )


def hf_unpermute(w_OxI, n_heads):
    out_dim, in_dim = w_OxI.shape
    return (
        w_OxI.reshape(n_heads, 2, out_dim // n_heads // 2, in_dim)
        .transpose(0, 2, 1, 3)
        .reshape(out_dim, in_dim)
    )


def test_bf16_shards_are_the_tree_rounded_once(tmp_path):
    """--dtype bfloat16 at a small shard size: several shards, an index whose total_size is the bytes
    of all tensors, each tensor the fp32 tree rounded to nearest-even bf16 (ml_dtypes)."""
    st = pytest.importorskip('safetensors.numpy')
    tree = random_tree(LLAMA, 5)
    save_hf(tmp_path / 'hf', LLAMA, tree, dtype='bfloat16', max_shard_size='4KB')
    index = json.loads((tmp_path / 'hf' / 'model.safetensors.index.json').read_text())
    shards = sorted(set(index['weight_map'].values()))
    assert len(shards) > 2 and shards[-1] == f'model-{len(shards):05d}-of-{len(shards):05d}.safetensors'
    loaded = {}
    for shard in shards:
        part = st.load_file(str(tmp_path / 'hf' / shard))
        assert sum(t.nbytes for t in part.values()) <= 4000 or len(part) == 1
        assert all(index['weight_map'][n] == shard for n in part)
        loaded.update(part)
    assert index['metadata']['total_size'] == sum(t.nbytes for t in loaded.values())
    assert all(t.dtype == ml_dtypes.bfloat16 for t in loaded.values())
    embed = tree['wte']['embedding'].astype(ml_dtypes.bfloat16)
    assert loaded['model.embed_tokens.weight'].tobytes() == embed.tobytes()
    header, back = load_hf(tmp_path / 'hf')
    assert header == LLAMA
    np.testing.assert_array_equal(
        back['lm_head']['kernel'], tree['lm_head']['kernel'].astype(ml_dtypes.bfloat16).astype(np.float32)
    )
    # Exported again from what it read: the same bytes (bf16 -> fp32 -> bf16 is exact).
    save_hf(tmp_path / 'again', header, back, dtype='bfloat16', max_shard_size='4KB')
    for shard in shards:
        assert (tmp_path / 'again' / shard).read_bytes() == (tmp_path / 'hf' / shard).read_bytes()


def test_safetensors_package_reads_our_file(tmp_path):
    st = pytest.importorskip('safetensors.numpy')
    tree = random_tree(GPT2, 0)
    save_hf(tmp_path / 'hf', GPT2, tree)
    loaded = st.load_file(str(tmp_path / 'hf' / 'model.safetensors'))
    mine = read_st(tmp_path / 'hf' / 'model.safetensors')
    assert loaded.keys() == mine.keys() and all(np.array_equal(loaded[k], mine[k]) for k in mine)


def test_gpt2_export_runs_in_the_reference_and_round_trips(tmp_path):
    tree = random_tree(GPT2, 1)
    save_hf(tmp_path / 'hf', GPT2, tree)
    config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert config['architectures'] == ['GPT2LMHeadModel'] and config['tie_word_embeddings'] is True
    assert (config['n_embd'], config['n_layer'], config['n_head'], config['vocab_size']) == (16, 2, 2, 50)
    hf = read_st(tmp_path / 'hf' / 'model.safetensors')
    assert 'lm_head.weight' not in hf and hf['transformer.wte.weight'].shape == (50, 16)  # tied, unpadded
    L = GPT2.num_layers
    layer = lambda name: np.stack([hf[f'transformer.h.{i}.{name}'] for i in range(L)])  # noqa: E731
    ref_tree = {
        'wte/embedding': hf['transformer.wte.weight'],
        'wpe/embedding': hf['transformer.wpe.weight'],
        'ln_f/scale': hf['transformer.ln_f.weight'],
        'ln_f/bias': hf['transformer.ln_f.bias'],
    }
    for norm in ('ln_1', 'ln_2'):
        ref_tree[f'h/{norm}/scale'] = layer(f'{norm}.weight')
        ref_tree[f'h/{norm}/bias'] = layer(f'{norm}.bias')
    for module in ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_proj'):  # Conv1D: (in, out) as ours
        ref_tree[f"h/{module.replace('.', '/')}/kernel"] = layer(module + '.weight')
        ref_tree[f"h/{module.replace('.', '/')}/bias"] = layer(module + '.bias')
    expected = ref.gpt2_logits(ref_tree, GPT2.num_heads, TOKENS)
    np.testing.assert_allclose(our_logits('gpt2', GPT2, tree), expected, atol=2e-5, rtol=1e-5)

    # HF -> llm.c gives back the file the tree makes, byte for byte.
    llmc_io.save_gpt2(str(tmp_path / 'orig.bin'), GPT2, tree)
    assert llmc_main(['convert', str(tmp_path / 'hf'), str(tmp_path / 'back.bin')]) == 0
    assert (tmp_path / 'back.bin').read_bytes() == (tmp_path / 'orig.bin').read_bytes()


def test_llama3_export_runs_in_the_reference_and_round_trips(tmp_path):
    tree = random_tree(LLAMA, 2)
    save_hf(tmp_path / 'hf', LLAMA, tree)
    config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert config['architectures'] == ['LlamaForCausalLM'] and config['tie_word_embeddings'] is False
    assert config['intermediate_size'] == LLAMA.ffn_hidden_dim and config['num_key_value_heads'] == 2
    hf = read_st(tmp_path / 'hf' / 'model.safetensors')
    C, kv, N, K = 32, LLAMA.kv_dim, 4, 2
    qkv = tree['h']['attn']['c_attn']['kernel']
    for i in range(LLAMA.num_layers):  # HF's own permutation of Meta's (out, in) rows
        np.testing.assert_array_equal(
            hf[f'model.layers.{i}.self_attn.q_proj.weight'], hf_permute(qkv[i][:, :C].T, N)
        )
        np.testing.assert_array_equal(
            hf[f'model.layers.{i}.self_attn.k_proj.weight'], hf_permute(qkv[i][:, C : C + kv].T, K)
        )
    layer = lambda name: np.stack([hf[f'model.layers.{i}.{name}'] for i in range(LLAMA.num_layers)])  # noqa: E731
    q = np.stack([hf_unpermute(w, N).T for w in layer('self_attn.q_proj.weight')])
    k = np.stack([hf_unpermute(w, K).T for w in layer('self_attn.k_proj.weight')])
    v = layer('self_attn.v_proj.weight').transpose(0, 2, 1)
    ref_tree = {
        'wte/embedding': hf['model.embed_tokens.weight'],
        'h/ln_1/scale': layer('input_layernorm.weight'),
        'h/attn/c_attn/kernel': np.concatenate([q, k, v], axis=2),
        'h/attn/c_proj/kernel': layer('self_attn.o_proj.weight').transpose(0, 2, 1),
        'h/ln_2/scale': layer('post_attention_layernorm.weight'),
        'h/mlp/c_fc/kernel': layer('mlp.up_proj.weight').transpose(0, 2, 1),
        'h/mlp/c_fc2/kernel': layer('mlp.gate_proj.weight').transpose(0, 2, 1),
        'h/mlp/c_proj/kernel': layer('mlp.down_proj.weight').transpose(0, 2, 1),
        'ln_f/scale': hf['model.norm.weight'],
        'lm_head/kernel': hf['lm_head.weight'].T,
    }
    expected = ref.llama3_logits(ref_tree, N, K, TOKENS, config['rope_theta'], config['rms_norm_eps'])
    np.testing.assert_allclose(our_logits('llama3', LLAMA, tree), expected, atol=2e-5, rtol=1e-5)

    llmc_io.save_llama3(str(tmp_path / 'orig.bin'), LLAMA, tree)
    assert llmc_main(['convert', str(tmp_path / 'hf'), str(tmp_path / 'back.bin')]) == 0
    assert (tmp_path / 'back.bin').read_bytes() == (tmp_path / 'orig.bin').read_bytes()
    # A folder from elsewhere (no llmc_header) still gets a header whose FFN size is intermediate_size.
    del config['llmc_header']
    (tmp_path / 'hf' / 'config.json').write_text(json.dumps(config))
    header, params = load_hf(tmp_path / 'hf')
    assert header.ffn_hidden_dim == LLAMA.ffn_hidden_dim
    np.testing.assert_array_equal(params['h']['attn']['c_attn']['kernel'], qkv)


def test_llmc_file_to_hf_and_bad_folders(tmp_path, capsys):
    llmc_io.save_gpt2(str(tmp_path / 'm.bin'), GPT2, random_tree(GPT2, 3))
    assert llmc_main(['convert', str(tmp_path / 'm.bin'), str(tmp_path / 'hf'), '--to', 'hf']) == 0
    assert sorted(p.name for p in (tmp_path / 'hf').iterdir()) == [
        'config.json',
        'generation_config.json',
        'model.safetensors',
    ]
    assert llmc_main(['info', str(tmp_path / 'hf')]) == 0
    assert 'GPT2LMHeadModel' in capsys.readouterr().out
    config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    config['model_type'] = 'bert'
    (tmp_path / 'hf' / 'config.json').write_text(json.dumps(config))
    capsys.readouterr()
    assert llmc_main(['convert', str(tmp_path / 'hf'), str(tmp_path / 'x.bin')]) == 2
    err = capsys.readouterr().err
    assert 'model_type: expected gpt2 or llama, found bert' in err and err.count('\n') == 1
    assert not (tmp_path / 'x.bin').exists()


@pytest.mark.parametrize('family', ['gpt2', 'llama3'])
def test_transformers_loads_the_export(tmp_path, family):
    torch = pytest.importorskip('torch')
    transformers = pytest.importorskip('transformers')
    header = GPT2 if family == 'gpt2' else LLAMA
    tree = random_tree(header, 4)
    save_hf(tmp_path / 'hf', header, tree)
    cls = transformers.GPT2LMHeadModel if family == 'gpt2' else transformers.LlamaForCausalLM
    model = cls.from_pretrained(str(tmp_path / 'hf'), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(theirs, our_logits(family, header, tree), atol=1e-4, rtol=1e-4)
