"""--zero_stage 0..3 on 8 fake CPU devices (mesh data 8): the bytes a device holds fall
stage by stage, and the losses are stage 0's.

Per device: the training state's shards on device 0 (parameters, optimizer state), plus the
compiled step's temporary buffers (where the gradients and their accumulation live), from
XLA's own memory analysis of the step. Expected, from ZeRO's definition: stage 1 splits the
optimizer state (state bytes fall), stage 2 the gradients (the step's temporaries fall,
state unchanged), stage 3 the parameters (state bytes fall again).
"""

import jax
import numpy as np
import pytest

from jaxtrain.parallel import sharding
from jaxtrain.train.setup import build_trainer
from trainer_runs import load_config, tiny_llmc_model

pytestmark = pytest.mark.slow  # four 8-device programs compiled and their runs compared


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    if jax.device_count() < 8:
        pytest.skip('needs 8 devices (tests/conftest.py makes 8 fake CPU devices)')
    model = tiny_llmc_model(tmp_path_factory.mktemp('zero') / 'gpt2.bin')  # C 32, V 512: all divide by 8
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 512, (2, 2, 8, 64))  # (inputs|targets, A micro-steps, B rows, T)
    results = {}
    for stage in range(4):
        # 1 row per rank x 8 ranks x 2 micro-steps: the accumulated gradient is a carry.
        config = load_config(
            'gpt2',
            llmc_filepath=model,
            num_devices=8,
            mesh_data=8,
            zero_stage=stage,
            batch_size=1,
            total_batch_size=2 * 8 * 64,
            learning_rate=1e-3,
        )
        parts = build_trainer(config)
        device = parts.devices[0]
        state_bytes = sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(parts.state)
            for shard in leaf.addressable_shards
            if shard.device == device
        )
        inputs, targets = sharding.put_global((tokens[0], tokens[1]), parts.train_batch_sharding)
        compiled = parts.train_step.lower(parts.state, inputs, targets).compile()
        temp_bytes = compiled.memory_analysis().temp_size_in_bytes
        state, losses = parts.state, []
        for _ in range(2):
            state, metrics = compiled(state, inputs, targets)
            losses.append(float(metrics['loss']))
        results[stage] = {'state': state_bytes, 'temp': temp_bytes, 'losses': losses}
    return results


def test_bytes_per_device_fall_stage_by_stage(runs):
    state = [runs[stage]['state'] for stage in range(4)]
    temp = [runs[stage]['temp'] for stage in range(4)]
    assert state[0] > state[1] == state[2] > state[3], state  # optimizer state, then parameters
    assert temp[2] < temp[1], temp  # the gradients
    total = [s + t for s, t in zip(state, temp)]
    assert total[0] > total[1] > total[2] > total[3], total
    # Adam keeps two moments per parameter: stage 1 leaves about 1/3 + 2/3/8 of stage 0's.
    assert state[1] / state[0] == pytest.approx(1 / 3 + 2 / 3 / 8, rel=0.02)


def test_losses_equal_stage_zero(runs):
    for stage in (1, 2, 3):
        np.testing.assert_allclose(runs[stage]['losses'], runs[0]['losses'], rtol=2e-6)
