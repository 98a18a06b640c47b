"""The tests' tiny GPT-2 and LLaMA-3: one shape each (2 layers, 32 channels, 256 tokens),
which a test changes with keyword overrides, and random weights for any llm.c header.

`tiny_header(family, **overrides)` is the llmc_io header, `tiny_config(...)` the model's
own config with the same fields; `random_params(header, seed)` a nested params tree of
the header's shapes (llmc_io/PARAMS_SPEC.md).
"""

import dataclasses

import numpy as np

TINY = {
    'gpt2': {
        'max_seq_len': 64,
        'vocab_size': 256,
        'padded_vocab_size': 256,
        'num_layers': 2,
        'num_heads': 2,
        'channels': 32,
    },
    'llama3': {
        'max_seq_len': 64,
        'vocab_size': 256,
        'num_layers': 2,
        'num_heads': 4,
        'num_kv_heads': 2,
        'channels': 32,
        'ffn_dim_multiplier': 1.0,
        'multiple_of': 16,
        'norm_eps': 1e-5,
        'rope_theta': 10000.0,
        'use_scaled_rope': False,
        'max_gen_batch_size': 4,
    },
}


def tiny_header(family='gpt2', **overrides):
    """llmc_io.GPT2Header or LLaMA3Header of the tiny model; a GPT-2 vocab_size override
    without padded_vocab_size pads to itself."""
    import llmc_io

    fields = {**TINY[family], **overrides}
    if family == 'gpt2' and 'vocab_size' in overrides and 'padded_vocab_size' not in overrides:
        fields['padded_vocab_size'] = overrides['vocab_size']
    return (llmc_io.GPT2Header if family == 'gpt2' else llmc_io.LLaMA3Header)(**fields)


def tiny_config(family='gpt2', **overrides):
    """The model's config (jaxtrain.models.FAMILIES) with the tiny header's fields."""
    from jaxtrain.models import FAMILIES

    _, config_cls, _ = FAMILIES[family]
    return config_cls(**dataclasses.asdict(tiny_header(family, **overrides)))


def random_params(header, seed=0, std=0.02, everywhere=False) -> dict:
    """{'wte': {'embedding': ...}, 'h': {...}, ...} in the header's shapes: N(0, std) weights,
    unit norm scales and zero biases, or N(0, std) in every tensor with `everywhere` (so no
    term of a model can hide behind a one or a zero)."""
    rng, params = np.random.default_rng(seed), {}
    for path, shape in header.param_shapes().items():
        *parents, leaf = path.split('/')
        node = params
        for key in parents:
            node = node.setdefault(key, {})
        if everywhere or leaf not in ('scale', 'bias'):
            node[leaf] = rng.normal(0, std, shape).astype(np.float32)
        else:
            node[leaf] = (np.ones if leaf == 'scale' else np.zeros)(shape, np.float32)
    return params
