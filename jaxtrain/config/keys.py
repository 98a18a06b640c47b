"""Every training key: its default and one line of meaning. configs/*.py start here.

The same table gives each key its plain command-line flag (`--save_steps 20`, as
InfiniTrain spells them; flags.py) and its `--help` text. Defaults follow InfiniTrain's
examples (batch 4, sequence 64, total 256 tokens per step, 10 steps) except the
optimizer, which is AdamW.
"""

import ml_collections

# (key, default, help). Grouped as model / data / optimization / logging / checkpoints.
KEYS = (
    ('model_family', 'gpt2', 'gpt2 | llama3 (set by the config file)'),
    ('model', 'tiny', 'model variant, e.g. tiny, small, d12 / llama3.2-1b; an llmc file header overrides it'),
    ('llmc_filepath', '', 'llm.c model file to start from (its header sets the model shape)'),
    (
        'llmc_ffn_dim_multiplier',
        0.0,
        'LLaMA-3: true ffn_dim_multiplier when the file stored it truncated (0 = file)',
    ),
    ('llmc_norm_eps', 0.0, 'LLaMA-3: true norm_eps when the file stored it truncated (0 = file)'),
    ('dtype', 'float32', 'float32 | bfloat16: compute dtype; params and optimizer state stay fp32'),
    ('scan_layers', True, 'scan over layers (fast compile) or unroll them (false: faster GPU steps)'),
    ('num_devices', 0, 'devices to train on (0 = all); the mesh_* keys arrange them'),
    ('mesh_data', -1, 'mesh axis data: replicated parameters, batch split (-1 = the devices left)'),
    ('mesh_fsdp', 1, 'mesh axis fsdp: batch split, parameters and optimizer state sharded (-1 = fill)'),
    ('mesh_tensor', 1, 'mesh axis tensor: tensor-parallel MLP and attention projections (-1 = fill)'),
    (
        'pipeline_parallel',
        1,
        'pipeline stages P: the layers split evenly over a mesh axis pipeline, microbatches = accumulation',
    ),
    (
        'virtual_pipeline_parallel',
        1,
        'layer chunks V per pipeline stage (interleaved: chunk c on stage c mod P); P × V must divide L',
    ),
    (
        'coordinator_address',
        '',
        "many processes: host:port of process 0 ('' = JAX_COORDINATOR_ADDRESS, SLURM, or one process)",
    ),
    ('num_processes', 0, 'many processes: how many in all (0 = JAX_NUM_PROCESSES, SLURM, or 1)'),
    ('process_id', -1, "many processes: this process's index (-1 = JAX_PROCESS_ID or SLURM)"),
    (
        'attention',
        'auto',
        'auto | xla | cudnn | pallas (auto: on GPU in bf16 cuDNN, or Pallas when deterministic and '
        'unrolled; else XLA)',
    ),
    ('input_bin', '', "glob of llm.c token shards ('' = built-in stdlib corpus, GPT-2 only)"),
    ('input_val_bin', '', "glob of validation shards ('' = none, or the built-in corpus's val shard)"),
    ('val_loss_every', 0, 'validation loss every N steps (0 = never)'),
    ('val_max_steps', 5, 'validation batches per evaluation'),
    ('batch_size', 4, 'sequences per data-parallel rank per micro-step'),
    ('sequence_length', 64, 'tokens per sequence (T)'),
    ('total_batch_size', 256, 'tokens per optimizer step; sets gradient accumulation'),
    ('num_iteration', 10, 'optimizer steps in total (global step, counted across resumes)'),
    ('optimizer', 'adamw', 'adamw | adam | sgd'),
    ('learning_rate', 1e-4, 'peak learning rate'),
    ('lr_schedule', 'constant', 'constant | cosine (linear warmup, then cosine to min_lr_ratio)'),
    ('warmup_steps', 0, 'linear warmup steps'),
    ('min_lr_ratio', 0.0, 'cosine: final learning rate as a fraction of learning_rate'),
    ('beta1', 0.9, 'Adam beta1'),
    ('beta2', 0.95, "Adam beta2 (llm.c's CUDA trainer; the LLaMA-3 config uses InfiniTrain's 0.999)"),
    ('eps', 1e-8, 'Adam epsilon'),
    ('weight_decay', 0.0, 'AdamW decoupled weight decay, on tensors of 2+ dimensions only'),
    ('grad_clip', 0.0, 'global-norm gradient clipping (0 = off, as in InfiniTrain)'),
    ('seed', 42, 'seed of the random init and the training rng'),
    ('metrics_dir', '', "directory for metrics.jsonl ('' = no file)"),
    ('checkpoint_dir', '', 'root of this run\'s checkpoints (checkpoint_step_NNNNNN/ inside)'),
    ('save_steps', 0, 'save every N steps (0 = never); the last step is saved whenever saving is on'),
    ('max_checkpoint_keep', 0, 'keep the newest K checkpoints (0 = keep all)'),
    ('keep_every_steps', 0, 'also keep, forever, checkpoints whose step is a multiple of N (0 = off)'),
    ('save_every_minutes', 0.0, 'also save when this many minutes passed since the last save (0 = off)'),
    ('save_optimizer_state', True, 'save the optimizer state too (needed for an exact resume)'),
    ('resume_from', '', "a checkpoint_step_NNNNNN directory, or 'latest' (newest in checkpoint_dir)"),
    (
        'overwrite_later_checkpoints',
        False,
        'resume into a checkpoint_dir holding later steps by deleting them',
    ),
    (
        'deterministic',
        'auto',
        'auto | true | false: deterministic GPU kernels (auto: on when saving or resuming)',
    ),
)

HELP = {key: text for key, _, text in KEYS}


def base_config(model_family: str) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict({key: default for key, default, _ in KEYS})
    config.model_family = model_family
    return config
