"""Hugging Face folders as the Hub holds them, written with the `safetensors` library itself (never
llmc_io's code): LlamaForCausalLM's tensor names and (out, in) layouts, one file or shards with
model.safetensors.index.json."""

import json

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

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
