"""InfiniTrain's own test harness, as data: the `test_groups` of scripts/test_config.json at
InfiniTensor/InfiniTrain b24d92f280dd5f46d6c0eee97230d9fcffc70785, copied row for row
(tag, id, args), and the variables and command template of scripts/run_models_and_profile.bash
at the same commit. tests/config/test_infinitrain_harness.py runs them through our trainer.
"""

COMMIT = 'b24d92f280dd5f46d6c0eee97230d9fcffc70785'

# run_models_and_profile.bash: per test, for each model,
#   ${prefix}./gpt2 --input_bin ${GPT2_INPUT_BIN} --llmc_filepath ${GPT2_LLMC_FILEPATH} --device cuda ARGS
#   ${prefix}./llama3 --input_bin ${LLAMA3_INPUT_BIN} --llmc_filepath ${LLAMA3_LLMC_FILEPATH} \
#       --device cuda ARGS
# where ARGS is `--KEY VALUE` per args entry (jq's tostring), with --save/--load namespaced by
# model and run mode, and @CKPT_ROOT_DIR@ replaced by the variable CKPT_ROOT_DIR.
COMMAND_TEMPLATE = (
    '{prefix}./{model} --input_bin {input_bin} --llmc_filepath {llmc_filepath} --device cuda {args}'
)
VARIABLES = {
    'GPT2_INPUT_BIN': (
        '/data1/shared/InfiniTrain-dev/data/llmc/gpt2/tinyshakespeare/tiny_shakespeare_train.bin'
    ),
    'GPT2_LLMC_FILEPATH': '/data1/shared/InfiniTrain-dev/data/llmc/gpt2/gpt2_124M.bin',
    'LLAMA3_INPUT_BIN': (
        '/data1/shared/InfiniTrain-dev/data/llmc/llama3/tinyshakespeare/tiny_shakespeare_train.bin'
    ),
    'LLAMA3_LLMC_FILEPATH': '/data1/shared/InfiniTrain-dev/data/llmc/llama3/llama3.2_1B_fp32.bin',
    'CKPT_ROOT_DIR': '/data1/ckpt',
}

TEST_GROUPS = (
    ('basic', '1', {'dtype': 'float32'}),
    ('basic', '1_bfloat16', {'dtype': 'bfloat16'}),
    ('basic', '2', {'dtype': 'float32', 'num_iteration': 10, 'batch_size': 80, 'total_batch_size': 5120}),
    ('basic', '2_bfloat16', {
        'dtype': 'bfloat16', 'num_iteration': 10, 'batch_size': 80, 'total_batch_size': 5120,
    }),
    ('basic', '3', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120,
    }),
    ('basic', '3_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120,
    }),
    ('basic', '4', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4,
    }),
    ('basic', '4_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4,
    }),
    ('basic', '5', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True,
    }),
    ('basic', '5_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True,
    }),
    ('basic', '6', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 8,
    }),
    ('basic', '6_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 8,
    }),
    ('basic', '7', {
        'dtype': 'float32', 'nthread_per_process': 4, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 4, 'virtual_pipeline_parallel': 2,
    }),
    ('basic', '7_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 4, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 4, 'virtual_pipeline_parallel': 2,
    }),
    ('basic', '8', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2,
    }),
    ('basic', '8_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2,
    }),
    ('zero', '3_distopt', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'zero_stage': 1,
    }),
    ('zero', '3_zero2', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'zero_stage': 2,
    }),
    ('zero', '3_bfloat16_distopt', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'zero_stage': 1,
    }),
    ('zero', '3_bfloat16_zero2', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'zero_stage': 2,
    }),
    ('zero', '4_distopt', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'zero_stage': 1,
    }),
    ('zero', '4_zero2', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'zero_stage': 2,
    }),
    ('zero', '4_bfloat16_distopt', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'zero_stage': 1,
    }),
    ('zero', '4_bfloat16_zero2', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'zero_stage': 2,
    }),
    ('zero', '5_distopt', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'zero_stage': 1,
    }),
    ('zero', '5_zero2', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'zero_stage': 2,
    }),
    ('zero', '5_bfloat16_distopt', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'zero_stage': 1,
    }),
    ('zero', '5_bfloat16_zero2', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'zero_stage': 2,
    }),
    ('zero', '8_distopt', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2, 'zero_stage': 1,
    }),
    ('zero', '8_bfloat16_distopt', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2, 'zero_stage': 1,
    }),
    ('lora', '1_lora', {
        'dtype': 'float32', 'lora_rank': 8, 'lora_alpha': 16.0, 'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '1_lora_bfloat16', {
        'dtype': 'bfloat16', 'lora_rank': 8, 'lora_alpha': 16.0, 'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '2_lora', {
        'dtype': 'float32', 'num_iteration': 10, 'batch_size': 80, 'total_batch_size': 5120, 'lora_rank': 8,
        'lora_alpha': 16.0, 'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '2_lora_bfloat16', {
        'dtype': 'bfloat16', 'num_iteration': 10, 'batch_size': 80, 'total_batch_size': 5120, 'lora_rank': 8,
        'lora_alpha': 16.0, 'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '3_lora', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'lora_rank': 8, 'lora_alpha': 16.0,
        'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '3_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'lora_rank': 8, 'lora_alpha': 16.0,
        'lora_target_modules': 'c_attn,attn.c_proj',
    }),
    ('lora', '4_lora', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'lora_rank': 4, 'lora_alpha': 8.0,
        'lora_target_modules': 'c_attn,c_fc,c_proj',
    }),
    ('lora', '4_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'lora_rank': 16, 'lora_alpha': 32.0,
        'lora_target_modules': 'c_attn,c_fc,c_proj',
    }),
    ('lora', '5_lora', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'lora_rank': 4,
        'lora_alpha': 8.0, 'lora_target_modules': 'attn.c_proj,c_fc,c_proj',
    }),
    ('lora', '5_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 4, 'sequence_parallel': True, 'lora_rank': 16,
        'lora_alpha': 32.0, 'lora_target_modules': 'attn.c_proj,c_fc,c_proj',
    }),
    ('lora', '6_lora', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 8, 'lora_rank': 4, 'lora_alpha': 8.0,
        'lora_target_modules': 'c_attn,attn.c_proj,c_fc',
    }),
    ('lora', '6_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 8, 'lora_rank': 16, 'lora_alpha': 32.0,
        'lora_target_modules': 'c_attn,attn.c_proj,c_fc',
    }),
    ('lora', '7_lora', {
        'dtype': 'float32', 'nthread_per_process': 4, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 4, 'virtual_pipeline_parallel': 2, 'lora_rank': 4,
        'lora_alpha': 8.0, 'lora_target_modules': 'c_attn,c_proj',
    }),
    ('lora', '7_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 4, 'num_iteration': 10, 'batch_size': 10,
        'total_batch_size': 5120, 'pipeline_parallel': 4, 'virtual_pipeline_parallel': 2, 'lora_rank': 16,
        'lora_alpha': 32.0, 'lora_target_modules': 'c_attn,c_proj',
    }),
    ('lora', '8_lora', {
        'dtype': 'float32', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2, 'lora_rank': 4, 'lora_alpha': 8.0,
        'lora_target_modules': 'c_fc,c_proj',
    }),
    ('lora', '8_lora_bfloat16', {
        'dtype': 'bfloat16', 'nthread_per_process': 8, 'num_iteration': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2, 'lora_rank': 16, 'lora_alpha': 32.0,
        'lora_target_modules': 'c_fc,c_proj',
    }),
    ('checkpoint', 'ckpt_no_resume', {
        'num_iteration': 50, 'save_interval': 10, 'save': '@CKPT_ROOT_DIR@/no_resume',
    }),
    ('checkpoint', 'ckpt_resume', {
        'num_iteration': 50, 'save_interval': 10, 'load': '@CKPT_ROOT_DIR@/no_resume/checkpoint_step_000030',
        'save': '@CKPT_ROOT_DIR@/base_resume',
    }),
    ('checkpoint', 'ckpt_bfloat16', {
        'dtype': 'bfloat16', 'num_iteration': 50, 'save_interval': 10,
        'save': '@CKPT_ROOT_DIR@/bfloat16_no_resume',
    }),
    ('checkpoint', 'ckpt_bfloat16_resume', {
        'dtype': 'bfloat16', 'num_iteration': 50, 'save_interval': 10,
        'load': '@CKPT_ROOT_DIR@/bfloat16_no_resume/checkpoint_step_000030',
        'save': '@CKPT_ROOT_DIR@/bfloat16_resume',
    }),
    ('checkpoint', 'ckpt_3d_ddp_tp_pp', {
        'nthread_per_process': 8, 'num_iteration': 50, 'save_interval': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2, 'save': '@CKPT_ROOT_DIR@/3d_ddp2_tp2_pp2_no_resume',
        'save_optimizer_state': True, 'max_checkpoint_keep': 5,
    }),
    ('checkpoint', 'ckpt_3d_ddp_tp_pp_resume', {
        'nthread_per_process': 8, 'num_iteration': 50, 'save_interval': 10, 'batch_size': 40,
        'total_batch_size': 5120, 'tensor_parallel': 2, 'sequence_parallel': True, 'pipeline_parallel': 2,
        'virtual_pipeline_parallel': 2,
        'load': '@CKPT_ROOT_DIR@/3d_ddp2_tp2_pp2_no_resume/checkpoint_step_000030',
        'save': '@CKPT_ROOT_DIR@/3d_tp2_pp2_resume', 'save_optimizer_state': True, 'max_checkpoint_keep': 5,
    }),
)
