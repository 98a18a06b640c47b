"""Every training key: its default and one line of meaning. configs/*.py start here.

The same table gives each key its plain command-line flag (`--save_steps 20`, as
InfiniTrain spells them; flags.py) and its `--help` text. Defaults follow InfiniTrain's
examples (batch 4, sequence 64, total 256 tokens per step, 10 steps) except the
optimizer, which is AdamW.

The config files' paths: `--config=configs/gpt2.py[:variant]` from any directory. A relative
config path that is not there from the working directory is looked up in the repository (the
directory above the jaxtrain package, where configs/ lives in a checkout or an editable
install), then among the configs shipped in the package (jaxtrain/configs/ of a non-editable
install: pyproject.toml maps configs/ there).
"""

from pathlib import Path

import ml_collections

# total_batch_size's default: InfiniTrain's tokens a step (data/stream.py's batch_geometry turns it
# into micro-steps).
DEFAULT_TOTAL = 256

# (key, default, help). Grouped as model / data / optimization / logging / checkpoints.
KEYS = (
    ('model_family', 'gpt2', 'gpt2 | llama3 (set by the config file)'),
    ('model', 'tiny', 'model variant, e.g. tiny, small, d12 / llama3.2-1b; an llmc file header overrides it'),
    ('llmc_filepath', '', 'llm.c model file to start from (its header sets the model shape)'),
    (
        'init_from',
        '',
        "weights only, for --model: a checkpoint step or root (either format), an HF folder (its "
        "config.json sets the model) or an llm.c file; fresh optimizer, schedule and data ('' = none)",
    ),
    (
        'llmc_ffn_dim_multiplier',
        0.0,
        'LLaMA-3: true ffn_dim_multiplier when the file stored it truncated (0 = file)',
    ),
    ('llmc_norm_eps', 0.0, 'LLaMA-3: true norm_eps when the file stored it truncated (0 = file)'),
    (
        'tie_embeddings',
        False,
        "LLaMA-3 --model: one tensor for wte and the head, trained tied as GPT-2's is (Llama-3.2-1B's "
        "and 3B's); an --init_from HF folder's config.json sets it",
    ),
    ('dtype', 'float32', 'float32 | bfloat16: compute dtype; params and optimizer state stay fp32'),
    ('scan_layers', True, 'scan over layers (fast compile) or unroll them (false: faster GPU steps)'),
    (
        'activation_recompute',
        False,
        'recompute layer activations in the backward pass (less memory, more compute)',
    ),
    (
        'recompute_granularity',
        'full',
        'with activation_recompute: full (a region keeps only its input) | selective (keeps the weight '
        "matmuls' outputs, recomputes attention and activations) | none",
    ),
    (
        'recompute_method',
        'none',
        'with full recompute: none (each layer a region) | uniform (groups of recompute_num_layers) | '
        'block (only the first recompute_num_layers layers)',
    ),
    ('recompute_num_layers', 0, 'layers per region (uniform) or recomputed layers (block); 1 or more there'),
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
        'sequence_parallel',
        False,
        'Megatron sequence parallelism: residual stream and norms split along T over mesh_tensor',
    ),
    (
        'context_parallel',
        1,
        'context parallelism C: each sequence cut along T into C contiguous slices over a mesh axis '
        'context (as InfiniTrain cuts it); attention crosses it by --cp_comm_type',
    ),
    (
        'cp_comm_type',
        'p2p',
        'all_gather (K, V gathered) | p2p (a ring passing K/V slices, online-softmax merge) | a2a '
        '(Ulysses all-to-all over heads): how attention crosses the context axis',
    ),
    (
        'zero_stage',
        0,
        'ZeRO over the data axis (data × context with context_parallel): 0 off | 1 optimizer state '
        'sharded | 2 + gradients reduce-scattered | 3 + parameters sharded (= fsdp)',
    ),
    ('device', 'auto', 'auto | cpu | cuda: the platform to train on (cuda without a GPU is an error)'),
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
        'auto | xla | cudnn | pallas (auto: on GPU in bf16 cuDNN; in fp16 cuDNN, or Pallas when '
        'deterministic and unrolled; else XLA)',
    ),
    (
        'cross_entropy',
        'auto',
        'auto | xla | pallas: the kernel of the loss and its gradient (auto: the fused Pallas kernel on '
        'one GPU in bf16; else XLA)',
    ),
    (
        'fused_kernels',
        'none',
        "none | layernorm | bias_gelu | all: GPT-2's residual add + LayerNorm and/or the MLP's bias + "
        'GELU as Pallas kernels instead of XLA fusions (one GPU; deterministic)',
    ),
    ('input_bin', '', "glob of llm.c token shards ('' = the built-in stdlib corpus, in the family's shards)"),
    (
        'shuffle',
        'none',
        "none | llmc: train batches in order, or in llm.c's permuted order (train_gpt2cu's default: "
        'per-epoch shard and sample permutations from its mt19937, seed 42)',
    ),
    (
        'llmc_require_master_weights',
        False,
        'resuming an llm.c run folder: refuse a state file without fp32 master weights (-w 0) '
        'instead of continuing from its bf16 model',
    ),
    ('input_val_bin', '', "glob of validation shards ('' = none, or the built-in corpus's val shard)"),
    (
        'val_loss_every',
        0,
        'validation loss every N steps (0 = never; not given beside an input_val_bin: every 20 steps, '
        'as llm.c, or at the last step of a shorter run)',
    ),
    ('val_max_steps', 5, 'validation batches per evaluation'),
    # Text samples (train/samples.py): from EOT, temperature 1.0, top-k 40, as llm.c.
    (
        'sample_every',
        -1,
        "llm.c's: a sample every N steps and after the last (0 = off; -1 = after the last step on "
        'the built-in corpus only)',
    ),
    (
        'freq_generate_txt',
        10,
        "InfiniTrain's: a sample every N steps, only with a tokenizer_bin (or tokenizer)",
    ),
    ('text_length', 64, 'tokens per sample, the EOT it starts from included'),
    (
        'tokenizer_bin',
        '',
        "llm.c tokenizer file for samples ('' = built-in byte tokenizer for GPT-2's vocabulary)",
    ),
    (
        'tokenizer',
        '',
        "Hugging Face tokenizer.json or tiktoken BPE file for samples and the HF export ('' = none)",
    ),
    ('overfit_single_batch', False, "train every step on the stream's first batch (a smoke test)"),
    ('batch_size', 4, 'sequences per data-parallel rank per micro-step'),
    ('sequence_length', 64, 'tokens per sequence (T)'),
    (
        'total_batch_size',
        DEFAULT_TOTAL,
        'tokens per optimizer step; sets gradient accumulation (0 = one micro-step)',
    ),
    ('num_iteration', 10, 'optimizer steps in total (global step, counted across resumes)'),
    ('optimizer', 'adamw', 'adamw | adam | sgd'),
    ('learning_rate', 1e-4, 'peak learning rate'),
    ('lr_schedule', 'constant', 'constant | cosine (linear warmup, then cosine to min_lr_ratio)'),
    ('warmup_steps', 0, 'linear warmup as llm.c: step s (from 0) takes learning_rate*(s+1)/warmup_steps'),
    ('min_lr_ratio', 0.0, 'cosine: final learning rate as a fraction of learning_rate'),
    # InfiniTrain's spelling of the schedule (PR 151): its own float32 arithmetic, step for step.
    # A run spells its schedule one way: these, or lr_schedule / warmup_steps / min_lr_ratio.
    (
        'lr_decay_style',
        'constant',
        "InfiniTrain's schedule: none | constant | linear | cosine | inverse-square-root, after "
        'lr_warmup_iters; none: no scheduler and no lr_scheduler.ckpt',
    ),
    ('lr_warmup_iters', 0, 'InfiniTrain: warmup steps, linear from lr_warmup_init (step 1) to learning_rate'),
    ('lr_warmup_init', 0.0, 'InfiniTrain: the learning rate of step 1 when lr_warmup_iters > 0'),
    ('min_lr', 0.0, "InfiniTrain: where the decay ends, an absolute learning rate (ours: min_lr_ratio)"),
    (
        'lr_decay_iters',
        0,
        'InfiniTrain: the step where the decay reaches min_lr, warmup included (0 = num_iteration)',
    ),
    ('beta1', 0.9, 'Adam beta1'),
    ('beta2', 0.95, "Adam beta2 (llm.c's CUDA trainer; the LLaMA-3 config uses InfiniTrain's 0.999)"),
    ('eps', 1e-8, 'Adam epsilon'),
    ('weight_decay', 0.0, 'AdamW decoupled weight decay, on tensors of 2+ dimensions only'),
    ('grad_clip', 0.0, 'global-norm gradient clipping (0 = off, as in InfiniTrain)'),
    ('seed', 42, 'seed of the random init and the training rng'),
    (
        'precision_check',
        '',
        "InfiniTrain's precision checker: 'level=1,path=DIR,format=simple|md5,save_tensors=true,"
        "md5_tolerance=X' ('' = off)",
    ),
    ('metrics_dir', '', "directory for metrics.jsonl ('' = no file)"),
    (
        'tensorboard_dir',
        '',
        "directory for TensorBoard event files: loss, val loss, lr, grad norm, tokens/s, MFU, times "
        "('' = none)",
    ),
    ('wandb_project', '', "Weights & Biases project to log the same to (needs pip install wandb; '' = none)"),
    (
        'peak_tflops',
        0.0,
        "peak dense TFLOP/s of one device for MFU (0 = the device's data-sheet value for the dtype)",
    ),
    (
        'trace_steps',
        '',
        "steps to trace with jax.profiler, FIRST-LAST (e.g. 41-43) or one step; the log then gives their "
        "device time per kernel ('' = none)",
    ),
    ('trace_dir', '', "directory for trace_steps' trace (TensorBoard's profile plugin, Perfetto)"),
    ('checkpoint_dir', '', 'root of this run\'s checkpoints (checkpoint_step_NNNNNN/ inside)'),
    ('save_steps', 0, 'save every N steps (0 = never); the last step is saved whenever saving is on'),
    ('max_checkpoint_keep', 3, "keep the newest K checkpoints (InfiniTrain's 3; 0 = keep all)"),
    ('keep_every_steps', 0, 'also keep, forever, checkpoints whose step is a multiple of N (0 = off)'),
    (
        'keep_best',
        0,
        'also keep the N checkpoints with the lowest validation loss measured at their step (0 = off)',
    ),
    ('save_every_minutes', 0.0, 'also save when this many minutes passed since the last save (0 = off)'),
    ('save_optimizer_state', True, 'save the optimizer state too (needed for an exact resume)'),
    (
        'checkpoint_format',
        'orbax',
        'orbax | infinitrain (HEAD: model.ckpt, optimizer.ckpt) | infinitrain-lrs (HEAD\'s files and '
        'lr_scheduler.ckpt, as the LR-scheduler generation) | infinitrain-bin (PR: llm.c model.bin, '
        "optimizer.bin) | llmc (an llm.c run folder that train_gpt2cu -y 1 resumes; needs --shuffle llmc); "
        "InfiniTrain's pth/ckpt/bin are aliases",
    ),
    (
        'resume_from',
        '',
        "a checkpoint step of any kind (a checkpoint_step_NNNNNN directory, ours or InfiniTrain's; an llm.c "
        "run folder or its model_NNNNNNNN.bin), or 'latest' (newest in checkpoint_dir)",
    ),
    (
        'overwrite_later_checkpoints',
        False,
        'resume into a checkpoint_dir holding later steps by deleting them',
    ),
    # LoRA (models/lora.py), under InfiniTrain's flag names.
    ('lora_rank', 0, 'LoRA rank r (0 = off: full fine-tuning); the base weights stay frozen'),
    ('lora_alpha', 16.0, 'LoRA alpha: the adapter adds (alpha/r)·x·Aᵀ·Bᵀ'),
    (
        'lora_target_modules',
        'c_attn,c_proj',
        'comma-separated projections to adapt, matched as name suffixes like InfiniTrain '
        '(c_attn, c_proj = attn.c_proj and mlp.c_proj, attn.c_proj, c_fc, c_fc2, mlp.c_proj)',
    ),
    ('lora_save_path', '', "write the LoRA weights in InfiniTrain's file format after training ('' = no)"),
    (
        'lora_save_layout',
        'master',
        "master (PR 150's: whole tensors, names in sorted order, no module. prefix) | head (b24d92f's: "
        'by layer, then name)',
    ),
    ('lora_load_path', '', "start from an InfiniTrain LoRA weights file ('' = upstream's init)"),
    (
        'accept_changed_data',
        False,
        'resume although the training data differs from the checkpoint\'s (what changed is logged)',
    ),
    (
        'deterministic',
        'auto',
        'auto | true | false: deterministic GPU kernels (auto: on when saving or resuming)',
    ),
)


def base_config(model_family: str) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict({key: default for key, default, _ in KEYS})
    config.model_family = model_family
    return config


REPO = Path(__file__).resolve().parents[2]
SHIPPED = Path(__file__).resolve().parents[1] / 'configs'


def _candidates(path: str):
    yield REPO / path
    if Path(path).parts[:1] == ('configs',):
        yield SHIPPED.joinpath(*Path(path).parts[1:])


def shipped_config(name: str) -> Path | None:
    """configs/NAME of this checkout or installed package, or None."""
    return next((c for c in _candidates(f'configs/{name}') if c.is_file()), None)


def _resolved(value: str) -> str:
    path, colon, variant = value.partition(':')
    if not path or Path(path).is_absolute() or Path(path).exists():
        return value
    found = next((c for c in _candidates(path) if c.is_file()), None)
    return f'{found}{colon}{variant}' if found else value


def resolve_config_argument(argv: list[str]) -> list[str]:
    """argv with the value of `--config=PATH` / `--config PATH` resolved as above."""
    out, after_flag = [], False
    for arg in argv:
        if after_flag:
            arg, after_flag = _resolved(arg), False
        elif arg in ('--config', '-config'):
            after_flag = True
        elif arg.startswith(('--config=', '-config=')):
            name, value = arg.split('=', 1)
            arg = f'{name}={_resolved(value)}'
        out.append(arg)
    return out
