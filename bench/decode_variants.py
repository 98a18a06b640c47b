"""The KV-cache decoder's levers measured against each other: one line per variant and batch size.

    python bench/decode_variants.py                      # the default plan (about 3 min on an H200)
    python bench/decode_variants.py --plan default:unrolled,scan_nocast --batches 1
    python bench/decode_variants.py --model tiny --dtype float32 --new_tokens 8   # the logic, on CPU

A plan entry is FLAGS:VARIANT,VARIANT,...: FLAGS names a set of XLA flags (FLAG_SETS), each set
run in a process of its own (XLA reads its flags once per process), and each VARIANT a
DecodeOptions (VARIANTS). Every variant decodes the same random GPT-2 weights from EOT at
temperature 1 and top_k 40 (generate's defaults); its time is the median of three runs after a
warm-up run (the first run of a program also records its CUDA graphs), compilation excluded.

Tokens: a variant's are compared, at each batch size, with those of the first variant of its
process that casts the weights at the same point (cast_params), and must be equal: the other
levers (layers, positions_per_step, top_k_method) change how the loop is compiled, not what it
computes. Where the weights are cast (once before the loop, or inside it) may change the rounding
in bfloat16 (XLA fuses the casts into their users differently), and so, from random weights, the
sampled tokens: on an H200 scan_nocast and unrolled_nocast sampled others than unrolled. In
float32 the casts do nothing, so there every variant must give the first one's tokens. A
process whose variant breaks this says TOKENS DIFFER and exits 1 (and so does the whole run).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name -> DecodeOptions fields
VARIANTS = {
    # The decoder as it was: one scanned block, the stacked cache through the scan, weights cast
    # in the loop (its cache was laid out (L, B, S, K, H); this one is (L, B, K, S, H)).
    'scan_nocast': {'layers': 'scan', 'cast_params': False},
    'scan': {'layers': 'scan'},
    'unrolled': {},  # the default: layers unrolled, per-layer caches, weights cast once
    'unrolled_nocast': {'cast_params': False},
    'unrolled_u2': {'positions_per_step': 2},
    'unrolled_u4': {'positions_per_step': 4},
    'select': {'top_k_method': 'select'},
    'select_u4': {'top_k_method': 'select', 'positions_per_step': 4},
}
# XLA's command buffers (CUDA graphs) by command type. The default set records fusions and library
# calls but no loops, so each loop iteration is launched from the host; with WHILE (and
# CONDITIONAL) a whole loop can be one graph (CUDA's conditional nodes), and with
# command_buffer_unroll_loops a loop of known trip count is unrolled into the graph instead.
COMMAND_TYPES = 'FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION'
FLAG_SETS = {
    'default': '',
    'no_graphs': '--xla_gpu_enable_command_buffer=',
    'while_graphs': f'--xla_gpu_enable_command_buffer={COMMAND_TYPES},WHILE,CONDITIONAL',
    'while_graphs_unroll': f'--xla_gpu_enable_command_buffer={COMMAND_TYPES},WHILE,CONDITIONAL '
    '--xla_gpu_command_buffer_unroll_loops=true',
    'while_graphs_min1': f'--xla_gpu_enable_command_buffer={COMMAND_TYPES},WHILE,CONDITIONAL '
    '--xla_gpu_graph_min_graph_size=1',
}
# The comparisons that matter most first, so that --budget_s cuts the least telling ones.
DEFAULT_PLAN = (
    'default:unrolled,scan_nocast,unrolled_u4',
    'while_graphs:unrolled,unrolled_u4',
    'default:select,unrolled_nocast',
    'while_graphs_unroll:unrolled',
    'no_graphs:unrolled',
)


def parse_plan(entries) -> list[tuple[str, list[str]]]:
    plan = []
    for entry in entries:
        flags, _, variants = entry.partition(':')
        names = [v for v in variants.split(',') if v]
        if flags not in FLAG_SETS or not names or any(v not in VARIANTS for v in names):
            raise ValueError(
                f'--plan: expected FLAGS:VARIANT,... with FLAGS among {", ".join(FLAG_SETS)} and variants '
                f'among {", ".join(VARIANTS)}; found {entry!r}'
            )
        plan.append((flags, names))
    return plan


def measure(args, flags: str, variants: list[str]) -> int:
    """In this process (XLA_FLAGS already set): every variant at every batch size, a line each."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxtrain.models.decode import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DecodeOptions, Decoder
    from jaxtrain.models.gpt2 import GPT2, VARIANTS as GPT2_VARIANTS

    config = GPT2_VARIANTS[args.model]
    dtype = jnp.dtype(args.dtype)
    init = jax.jit(lambda: nnx.split(GPT2(config, rngs=nnx.Rngs(0)), nnx.Param)[1])
    params = nnx.to_pure_dict(init())  # fp32, as generate holds them
    graphdef = nnx.split(nnx.eval_shape(lambda: GPT2(config, dtype=dtype, rngs=nnx.Rngs(0))), nnx.Param)[0]
    prompt, key = [50256], jax.random.key(1337)
    # (batch, where the weights are cast) -> (variant, tokens) of the first variant of that kind;
    # float32 has one kind, its casts being no-ops.
    references, differ = {}, 0
    for batch in args.batches:
        for name in variants:
            began = time.perf_counter()
            options = DecodeOptions(**VARIANTS[name])
            decoder = Decoder(
                graphdef,
                config,
                batch_size=batch,
                length=len(prompt) + args.new_tokens,
                top_k=DEFAULT_TOP_K,
                options=options,
            )
            tokens, _ = decoder.timed(params, prompt, key, DEFAULT_TEMPERATURE)  # compiles, and warms up
            times = [decoder.timed(params, prompt, key, DEFAULT_TEMPERATURE)[1] for _ in range(3)]
            seconds = statistics.median(times)
            kind = (batch, None if dtype == jnp.float32 else options.cast_params)
            reference, want = references.setdefault(kind, (name, tokens))
            same = np.array_equal(tokens, want)
            differ += not same
            row = {
                'flags': flags,
                'variant': name,
                'batch': batch,
                'tokens_per_s': round(batch * args.new_tokens / seconds, 1),
                'ms_per_position': round(1e3 * seconds / args.new_tokens, 4),
                'seconds': seconds,  # the median of runs_s
                'runs_s': times,
                'compile_s': round(decoder.compile_seconds, 1),
                'same_tokens': bool(same),  # as `compared_with`'s, which must match
                'compared_with': reference,
                'device': jax.devices()[0].device_kind,
            }
            print(
                f'decode {flags:20s} {name:16s} batch {batch:3d}: {row["tokens_per_s"]:>10,.0f} tok/s '
                f'({row["ms_per_position"]:.3f} ms/position; runs {", ".join(f"{t:.3f}" for t in times)} s; '
                f'compile {row["compile_s"]} s; {time.perf_counter() - began:.0f} s in all)'
                + ('' if same else f'  TOKENS DIFFER from {reference}, which must give the same'),
                flush=True,
            )
            if args.json:
                with open(args.json, 'a') as f:
                    f.write(json.dumps(row) + '\n')
    return 1 if differ else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--plan',
        nargs='+',
        default=list(DEFAULT_PLAN),
        help=f'FLAGS:VARIANT,... entries, run in order (default: {" ".join(DEFAULT_PLAN)})',
    )
    parser.add_argument(
        '--batches', default='1,16', help='comma-separated batch sizes, each variant at each (1,16)'
    )
    parser.add_argument('--model', default='d12', help='a GPT-2 variant of configs, random weights (d12)')
    parser.add_argument('--dtype', default='bfloat16', help='compute dtype (bfloat16)')
    parser.add_argument('--new_tokens', type=int, default=256, help='tokens decoded after EOT (256)')
    parser.add_argument(
        '--json', default='', help="append each line's numbers to this JSONL file ('' = none)"
    )
    parser.add_argument(
        '--budget_s', type=float, default=170, help='start no process after this many seconds (170)'
    )
    parser.add_argument('--child', default='', help=argparse.SUPPRESS)  # FLAGS:VARIANTS, in this process
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(',') if b]
    if args.child:
        [(flags, variants)] = parse_plan([args.child])
        return measure(args, flags, variants)
    try:
        plan = parse_plan(args.plan)
    except ValueError as e:
        parser.error(str(e))
    began, failed = time.perf_counter(), 0
    for flags, variants in plan:
        left = args.budget_s - (time.perf_counter() - began)
        if left <= 0:
            print(f'decode {flags}: skipped (past --budget_s {args.budget_s:.0f} s)', flush=True)
            continue
        env = dict(os.environ)
        env['XLA_FLAGS'] = ' '.join(filter(None, [env.get('XLA_FLAGS', ''), FLAG_SETS[flags]]))
        env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO), env.get('PYTHONPATH', '')]))
        command = [sys.executable, __file__, '--child', f'{flags}:{",".join(variants)}']
        command += ['--batches', ','.join(map(str, args.batches)), '--model', args.model]
        command += ['--dtype', args.dtype, '--new_tokens', str(args.new_tokens), '--json', args.json]
        try:
            done = subprocess.run(command, env=env, timeout=max(left, 30) + 30, check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 'timed out'
        if code != 0:
            failed += 1
            print(f'decode {flags}: failed ({code}); XLA_FLAGS={env["XLA_FLAGS"]!r}', flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
