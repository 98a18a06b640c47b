"""Memory per device of the pipelined step, measured by XLA's analysis of the compiled,
partitioned program (jaxtrain/tools/pipeline_bench.py), on the 8 fake CPU devices: with
twice the stages each device holds half the layers' parameters and optimizer state and
half the layers' work per tick, so its total falls."""

from jaxtrain.tools.bench import build
from jaxtrain.tools.pipeline_bench import compile_step, compiled_memory
from trainer_runs import load_config, tiny_llmc_model


def test_memory_per_device_falls_as_stages_grow(tmp_path):
    model = tiny_llmc_model(tmp_path / 'model.bin', num_layers=4)
    memory = {}
    for stages in (2, 4):
        config = load_config(
            'gpt2',
            llmc_filepath=model,
            batch_size=1,
            sequence_length=32,
            total_batch_size=256,  # 8 microbatches
            num_devices=stages,
            pipeline_parallel=stages,
        )
        memory[stages] = compiled_memory(compile_step(build(config)))
    # Parameters + Adam's two moments (fp32): a device of 2 stages holds 2 of the 4 layers, of
    # 4 stages 1, so the arguments differ by one layer's 3 copies: GPT-2's 12·C² + 13·C
    # parameters a layer (llm.c's count), C = 32 here.
    C = 32
    one_layer_bytes = 3 * 4 * (12 * C * C + 13 * C)
    saved = memory[2]['argument_bytes'] - memory[4]['argument_bytes']
    assert abs(saved - one_layer_bytes) < 0.05 * one_layer_bytes, (saved, one_layer_bytes)
    assert memory[4]['temp_bytes'] < memory[2]['temp_bytes']
    assert memory[4]['per_device_bytes'] < memory[2]['per_device_bytes']
