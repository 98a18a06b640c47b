"""The three parts a pipeline cuts a model into: what the first stage runs before the
blocks (the embedding), a chunk of the stacked blocks, and what the last stage runs after
them (the final norm; the head and loss are lm_head_loss.py's, as in the unpipelined step).

Axis letters: B batch, T time, C channels, H2 half the head dim.

Each part does exactly what the model's own `features` does around its `apply_blocks`
call (gpt2.py, llama3.py), so a pipelined loss equals the unpipelined one up to fp32
rounding (tests/parallel/test_pipeline.py holds them to it). They read the model's
modules rather than adding methods to the model classes, which other work edits.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.models.embedding import embedding_lookup
from jaxtrain.models.layer_stack import apply_blocks


def embed(model, tokens_BxT, first_position=0, whole_length=None):
    """(x_BxTxC, extra): the first block's input and the extra arguments every block takes.
    Under context parallelism `tokens_BxT` is one slice of sequences `whole_length` long,
    starting at `first_position` (traced): the positions are that slice's."""
    T = tokens_BxT.shape[1]
    whole_length = whole_length or T
    x_BxTxC = embedding_lookup(model.wte.embedding[...], tokens_BxT, model.deterministic).astype(model.dtype)
    if hasattr(model, 'wpe'):  # GPT-2: learned positions
        positions_TxC = jax.lax.dynamic_slice_in_dim(model.wpe.embedding[...], first_position, T, 0)
        return x_BxTxC + positions_TxC.astype(model.dtype)[None], ()
    # LLaMA-3: the RoPE tables, from the host in float64 as llama3.LLaMA3.features makes them.
    from jaxtrain.models.llama3 import rope_frequencies

    config = model.config
    freqs_H2 = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    angles_TxH2 = np.arange(whole_length, dtype=np.float64)[:, None] * freqs_H2[None, :]
    extra = tuple(
        jax.lax.dynamic_slice_in_dim(jnp.asarray(table, jnp.float32), first_position, T, 0)
        for table in (np.cos(angles_TxH2), np.sin(angles_TxH2))
    )
    return x_BxTxC, extra


def run_chunk(block_def, chunk_params: dict, x_BxTxC, extra, scan: bool, distinct_attention: bool = False):
    """The stacked blocks of one chunk (parameters with a leading axis of its layers), in order."""
    block = nnx.merge(block_def, nnx.State(chunk_params))
    return apply_blocks(block, x_BxTxC, *extra, scan=scan, distinct_attention=distinct_attention)


def finish(model, x_BxTxC):
    """The final hidden states (after ln_f) in the compute dtype, as `features` returns them."""
    return model.ln_f(x_BxTxC).astype(model.dtype)
