"""Memory per device of the pipelined step, measured by XLA's analysis of the compiled,
partitioned program (jaxtrain/tools/pipeline_bench.py), on the 8 fake CPU devices: with
twice the stages each device holds half the layers' parameters and optimizer state and
half the layers' work per tick, so its total falls.

The 4-stage program is the one tests/train/test_pipeline.py trains (LLaMA-3, 8 layers,
V = 2), so with the session's XLA cache only the 2-stage one is compiled here."""

import pytest

from jaxtrain.models.llama3 import LLaMA3Config
from jaxtrain.tools.bench_measure import build
from jaxtrain.tools.pipeline_bench import compile_step, compiled_memory
from trainer_runs import load_config, tiny_llmc_model


@pytest.mark.slow  # two 8-layer pipelined programs compiled
def test_memory_per_device_falls_as_stages_grow(tmp_path):
    model = tiny_llmc_model(tmp_path / 'model.bin', family='llama3', num_layers=8)
    memory = {}
    for stages in (2, 4):
        config = load_config(
            'llama3',
            llmc_filepath=model,
            batch_size=1,
            sequence_length=32,
            total_batch_size=256,  # 8 microbatches
            learning_rate=1e-3,
            num_devices=stages,
            pipeline_parallel=stages,
            virtual_pipeline_parallel=2,
        )
        memory[stages] = compiled_memory(compile_step(build(config)))
    # Parameters + Adam's two moments (fp32): a device of 2 stages holds 4 of the 8 layers, of
    # 4 stages 2, so the arguments differ by two layers' 3 copies (the layer size from the
    # model's own parameter count, as tiny_llmc_model shapes it).
    shape = dict(vocab_size=512, num_heads=4, num_kv_heads=2, channels=32, ffn_dim_multiplier=1.0)
    layers = lambda n: LLaMA3Config(num_layers=n, multiple_of=16, **shape).num_parameters
    per_layer = layers(1) - layers(0)
    two_layers_bytes = 2 * 3 * 4 * per_layer
    saved = memory[2]['argument_bytes'] - memory[4]['argument_bytes']
    assert abs(saved - two_layers_bytes) < 0.05 * two_layers_bytes, (saved, two_layers_bytes)
    assert memory[4]['temp_bytes'] < memory[2]['temp_bytes']
    assert memory[4]['per_device_bytes'] < memory[2]['per_device_bytes']
