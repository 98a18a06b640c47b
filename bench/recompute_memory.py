"""Peak memory and step time of one training step with and without activation recompute: the
`recompute` figure of bench/figures.py, which runs it in a child process.

    python bench/recompute_memory.py [--model d12] [--batch_size 2] [--sequence_length 256] [--steps 3] \
        [--scan_layers true|false] [--plans off,full,...]

Memory is XLA's account of the compiled step (arguments + outputs - donated aliases + temporaries,
tools/pipeline_bench.compiled_memory), so it is the same on any backend, CPU included, and on a busy
machine; the activations the backward pass keeps are the temporaries. Time is the fastest of `--steps`
steps after one warm-up, each plan's steps taken in turns (pipeline_bench.fastest_steps).
"""

import argparse
import json

PLANS = {  # name -> the PR 154 flags
    'off': {},
    'full': {'activation_recompute': True},
    'full-uniform-4': {
        'activation_recompute': True,
        'recompute_method': 'uniform',
        'recompute_num_layers': 4,
    },
    'full-block-6': {'activation_recompute': True, 'recompute_method': 'block', 'recompute_num_layers': 6},
    'selective': {'activation_recompute': True, 'recompute_granularity': 'selective'},
}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument('--model', default='d12', help='GPT-2 variant (configs/gpt2.py); default d12')
    parser.add_argument('--batch_size', type=int, default=2, help='sequences per step; default 2')
    parser.add_argument('--sequence_length', type=int, default=256, help='tokens per sequence; default 256')
    parser.add_argument('--steps', type=int, default=3, help='timed steps per plan; default 3')
    parser.add_argument(
        '--scan_layers',
        default='true',
        choices=('true', 'false'),
        help='scan over the layers (true) or unroll them (false), as the trainer\'s key; default true',
    )
    parser.add_argument(
        '--plans', default=','.join(PLANS), help=f'comma-separated, of {", ".join(PLANS)}; default all'
    )
    args = parser.parse_args()
    unknown = [name for name in args.plans.split(',') if name not in PLANS]
    if unknown:
        parser.error(f'--plans: expected names of {", ".join(PLANS)}, found {", ".join(unknown)}')

    from configs import gpt2
    from jaxtrain.tools.bench_measure import build
    from jaxtrain.tools.pipeline_bench import compile_step, compiled_memory, fastest_steps

    runs, memory = [], {}
    for name in args.plans.split(','):
        flags = PLANS[name]
        config = gpt2.get_config(args.model)
        config.num_devices = 1
        config.batch_size = args.batch_size
        config.sequence_length = args.sequence_length
        config.total_batch_size = args.batch_size * args.sequence_length
        config.scan_layers = args.scan_layers == 'true'
        config.update(flags)
        subject = build(config)
        compiled = compile_step(subject)
        memory[name] = compiled_memory(compiled)
        runs.append((compiled, subject))
    seconds = fastest_steps(runs, warmup=1, steps=args.steps)
    for (name, numbers), step_s in zip(memory.items(), seconds):
        print(
            json.dumps(
                {
                    'plan': name,
                    'peak_MiB': round(numbers['per_device_bytes'] / 2**20, 1),
                    'temp_MiB': round(numbers['temp_bytes'] / 2**20, 1),
                    'step_s': round(step_s, 3),
                }
            )
        )


if __name__ == '__main__':
    main()
