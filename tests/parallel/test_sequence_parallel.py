"""--sequence_parallel on 8 fake CPU devices (mesh data 2 x tensor 4): the per-device
activation memory of the compiled step falls, and the losses are those without it.

The activation memory is XLA's own memory analysis of the step (its temporary buffers:
the saved activations and their gradients; the parameters and optimizer state are the same
in both runs). Expected from Megatron's scheme: the residual stream and the norms are held
split along T over the 4 tensor devices instead of whole on each.
"""

import jax
import numpy as np
import pytest

from jaxtrain.parallel import sharding
from jaxtrain.train.setup import build_trainer
from trainer_runs import load_config, tiny_llmc_model


def _run(model, sequence_parallel: bool, tokens):
    config = load_config(
        'gpt2',
        llmc_filepath=model,
        num_devices=8,
        mesh_data=2,
        mesh_tensor=4,
        sequence_parallel=sequence_parallel,
        batch_size=4,
        total_batch_size=8 * 64,
        learning_rate=1e-3,
    )
    parts = build_trainer(config)
    assert parts.parallel_sizes == {'DP': 2, 'TP': 4, 'SP': 4 if sequence_parallel else 1, 'CP': 1, 'PP': 1}
    inputs, targets = sharding.put_global((tokens[0], tokens[1]), parts.train_batch_sharding)
    compiled = parts.train_step.lower(parts.state, inputs, targets).compile()
    state, losses = parts.state, []
    for _ in range(2):
        state, metrics = compiled(state, inputs, targets)
        losses.append(float(metrics['loss']))
    return compiled.memory_analysis().temp_size_in_bytes, losses


@pytest.mark.slow
def test_sequence_parallel_saves_activation_memory_and_keeps_the_losses(tmp_path):
    if jax.device_count() < 8:
        pytest.skip('needs 8 devices (tests/conftest.py makes 8 fake CPU devices)')
    model = tiny_llmc_model(tmp_path / 'gpt2.bin')
    tokens = np.random.default_rng(0).integers(0, 512, (2, 1, 8, 64))
    whole_bytes, whole_losses = _run(model, False, tokens)
    split_bytes, split_losses = _run(model, True, tokens)
    print(f'per-device step temporaries: {whole_bytes:,} B without, {split_bytes:,} B with it')
    assert split_bytes < 0.75 * whole_bytes
    np.testing.assert_allclose(split_losses, whole_losses, rtol=2e-6)
