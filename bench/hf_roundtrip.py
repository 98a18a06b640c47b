"""Llama-3.2-1B's shape through jaxtrain's Hugging Face import and export, against transformers
(on a machine with torch, transformers and a GPU; BENCHMARKS.md's "Hugging Face at 1B" rows):

    python bench/hf_roundtrip.py --work /tmp/hf_roundtrip [--json out.json]

1. transformers builds a random-init LlamaForCausalLM with Llama-3.2-1B's config (tied embeddings,
   rope_scaling llama3 factor 32, bfloat16) and saves it itself: save_pretrained(max_shard_size="500MB");
   with --shape llama3-8b, Llama-3-8B's (untied, unscaled RoPE) at max_shard_size="5GB".
2. jaxtrain starts a run from that folder with --init_from alone (configs/llama3.py, no --model;
   bf16 compute, learning rate 0 with SGD, one step); its step-1 loss is set beside transformers'
   loss of the same batch (bf16 on the GPU, and fp32).
3. `ckpt check-hf` compares jaxtrain's logits on the folder with transformers' (fp32, CPU).
4. `ckpt export --format hf --dtype bfloat16 --max_shard_size 500MB` of the step: every tensor is
   compared bit for bit with the source folder's (learning rate 0 leaves the weights as read), and
   transformers loads the export: its logits against the source model's.
Each jaxtrain command runs in its own process, timed, with its peak RSS. One JSON object is printed
(and written to --json) as the steps finish, so a run cut short still reports what it measured.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LLAMA_32_1B = dict(  # meta-llama/Llama-3.2-1B's config.json, less its special-token ids' names
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        'rope_type': 'llama3',
        'factor': 32.0,
        'low_freq_factor': 1.0,
        'high_freq_factor': 4.0,
        'original_max_position_embeddings': 8192,
    },
    tie_word_embeddings=True,
    bos_token_id=128000,
    eos_token_id=128001,
)
# meta-llama/Meta-Llama-3-8B's config.json: untied, unscaled RoPE; its Hub folder has 4 shards.
LLAMA_3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=None,
    tie_word_embeddings=False,
    bos_token_id=128000,
    eos_token_id=128001,
)
# --shape: (config, the max_shard_size transformers saves the source with and jaxtrain exports with)
SHAPES = {'llama3.2-1b': (LLAMA_32_1B, '500MB'), 'llama3-8b': (LLAMA_3_8B, '5GB')}
# Runs the module named by argv[1] as __main__ with the rest as its arguments; prints its peak RSS.
_MEASURED = (
    'import resource, runpy, sys\n'
    'module = sys.argv[1]\n'
    'sys.argv = [module] + sys.argv[2:]\n'
    'try:\n'
    '    runpy.run_module(module, run_name="__main__", alter_sys=True)\n'
    'finally:\n'
    '    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n'
    '    print("PEAK_RSS_KB", peak, file=sys.stderr, flush=True)\n'
)


def run_measured(module: str, args: list[str], env: dict | None = None) -> dict:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, '-c', _MEASURED, module, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith('PEAK_RSS_KB')]
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f'{module} {" ".join(args)}: exit {done.returncode}')
    return {
        'seconds': round(seconds, 1),
        'peak_rss_gib': round(peak[-1] / 2**20, 2) if peak else None,
        'rc': done.returncode,
        'stdout': done.stdout,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument('--work', required=True, help='a folder for the model folders, shard and checkpoint')
    parser.add_argument('--json', default='', help='also write the report here')
    parser.add_argument('--batch_size', type=int, default=4)
    parser.add_argument('--sequence_length', type=int, default=256)
    parser.add_argument('--shape', choices=sorted(SHAPES), default='llama3.2-1b', help='the model config')
    parser.add_argument(
        '--skip_check_hf',
        action='store_true',
        help='leave out step 3 (ckpt check-hf of the source folder), to fit a device call',
    )
    parser.add_argument(
        '--checkpoint_dir',
        default='',
        help="where jaxtrain's step goes (default WORK/ck); /dev/shm when the disk holds only the folders",
    )
    args = parser.parse_args()
    import safetensors.numpy
    import torch
    import transformers

    import llmc_io

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = {'transformers': transformers.__version__, 'torch': torch.__version__}

    def emit(**fields):
        report.update(fields)
        text = json.dumps(report, indent=1)
        print(text, flush=True)
        if args.json:
            Path(args.json).write_text(text + '\n')

    # 1. The source folder, saved by transformers itself.
    start = time.perf_counter()
    shape, shard_size = SHAPES[args.shape]
    report['shape'] = args.shape
    config = transformers.LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device('cuda'):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    source = work / 'source'
    model.save_pretrained(source, max_shard_size=shard_size)
    emit(
        source_save_seconds=round(time.perf_counter() - start, 1),
        source_files=sorted(p.name for p in source.iterdir()),
    )

    # 2. The batch jaxtrain's stream reads first, and transformers' losses of it.
    B, T = args.batch_size, args.sequence_length
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, B * T + 1)
    llmc_io.write_shard(work / 'train.bin', np.resize(tokens, 4 * B * T + 1), 'llama3')
    x = torch.as_tensor(tokens[: B * T].reshape(B, T), device='cuda')
    y = torch.as_tensor(tokens[1 : B * T + 1].reshape(B, T), device='cuda')
    losses = {}
    with torch.no_grad():
        for name, dtype in (('bfloat16', torch.bfloat16), ('float32', torch.float32)):
            logits = model.to(dtype)(x).logits.float()
            losses[name] = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
        cast_logits = model.to(torch.bfloat16)(x[:1, :64]).logits.float().cpu().numpy()
    del model
    torch.cuda.empty_cache()
    # The reference logits come from the source folder loaded as the export will be: a model cast
    # with .to(bfloat16) also casts RoPE's inv_freq buffer, which from_pretrained keeps in fp32, and
    # which moves bf16 logits (both are reported).
    source_model = transformers.LlamaForCausalLM.from_pretrained(source, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        source_logits = source_model(x[:1, :64]).logits.float().cpu().numpy()
    source_rope = dict(source_model.config.rope_parameters or {})
    del source_model
    torch.cuda.empty_cache()
    emit(transformers_step1_loss=losses)

    # 3. jaxtrain: --init_from the folder alone, one step at learning rate 0, bf16 compute.
    checkpoints, metrics = Path(args.checkpoint_dir or work / 'ck'), work / 'metrics'
    train = run_measured(
        'jaxtrain.main',
        [
            '--config=configs/llama3.py',
            f'--init_from={source}',
            f'--input_bin={work / "train.bin"}',
            f'--sequence_length={T}',
            f'--batch_size={B}',
            f'--total_batch_size={B * T}',
            '--num_iteration=1',
            '--learning_rate=0',
            '--dtype=bfloat16',
            f'--checkpoint_dir={checkpoints}',
            '--save_steps=1',
            '--save_optimizer_state=false',
            '--sample_every=0',
            f'--metrics_dir={metrics}',
            # At learning rate 0 the optimizer changes nothing; SGD keeps no moments, so that an 8B
            # model's fp32 weights, gradients and bf16 copies fit one 141 GB GPU (AdamW's 64 GB of
            # moments would not).
            '--optimizer=sgd',
        ],
        env={'XLA_PYTHON_CLIENT_MEM_FRACTION': '0.92'},
    )
    rows = [json.loads(line) for line in (metrics / 'metrics.jsonl').read_text().splitlines()]
    emit(
        jaxtrain_init_from={k: v for k, v in train.items() if k != 'stdout'},
        jaxtrain_step1_loss=next(row['loss'] for row in rows if row.get('step') == 1 and 'loss' in row),
    )

    # 4. Logits of the source folder: jaxtrain's reading against transformers' (fp32, CPU).
    if not args.skip_check_hf:
        check = run_measured(
            'jaxtrain.ckpt', ['check-hf', str(source), '--json'], env={'JAX_PLATFORMS': 'cuda'}
        )
        emit(check_hf_source={**json.loads(check['stdout']), 'seconds': check['seconds']})

    # 5. The bf16 sharded export of the step, bit for bit against the source, loaded by transformers.
    step_dir = checkpoints / 'checkpoint_step_000001'
    export = run_measured(
        'jaxtrain.ckpt',
        [
            'export',
            str(step_dir),
            '--format',
            'hf',
            '--output',
            str(work / 'export'),
            '--dtype',
            'bfloat16',
            '--max_shard_size',
            shard_size,
        ],
    )
    read = lambda folder: {  # noqa: E731
        k: v
        for f in sorted(folder.glob('*.safetensors'))
        for k, v in safetensors.numpy.load_file(str(f)).items()
    }
    ours, theirs = read(work / 'export'), read(source)
    differing = sorted(k for k in theirs if k not in ours or ours[k].tobytes() != theirs[k].tobytes())
    exported = (
        transformers.LlamaForCausalLM.from_pretrained(work / 'export', dtype=torch.bfloat16).cuda().eval()
    )
    with torch.no_grad():
        export_logits = exported(x[:1, :64]).logits.float().cpu().numpy()
    export_rope = dict(exported.config.rope_parameters or {})
    emit(
        rope_parameters_as_transformers_reads_them={'source': source_rope, 'export': export_rope},
        jaxtrain_export={k: v for k, v in export.items() if k != 'stdout'},
        export_files=sorted(p.name for p in (work / 'export').iterdir()),
        export_tensors_differing_from_source=differing[:5],
        export_tensor_count=len(ours),
        export_vs_source_max_logit_diff=float(np.max(np.abs(export_logits - source_logits))),
        # the comparison this figure made before: the source model cast with .to(bfloat16)
        export_vs_cast_source_max_logit_diff=float(np.max(np.abs(export_logits - cast_logits))),
    )


if __name__ == '__main__':
    main()
