"""Cross-entropy over the real vocabulary only (GPT-2 pads V=50257 to Vp=50304)."""

import jax
import jax.numpy as jnp


def cross_entropy(logits_BxTxV, targets_BxT, vocab_size: int):
    """Mean next-token cross-entropy in fp32; padded columns V..Vp-1 get probability 0."""
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    padded = logits_BxTxV.shape[-1]
    if padded > vocab_size:
        is_real = jnp.arange(padded) < vocab_size
        logits_BxTxV = jnp.where(is_real, logits_BxTxV, -jnp.inf)
    log_probs = jax.nn.log_softmax(logits_BxTxV, axis=-1)
    picked_BxT = jnp.take_along_axis(log_probs, targets_BxT[..., None], axis=-1)[..., 0]
    return -jnp.mean(picked_BxT)
