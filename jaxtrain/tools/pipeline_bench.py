"""What the benchmark adds for a pipelined config (pipeline_parallel > 1): memory per device
from the compiled step, and the bubble measured by timing.

  python -m jaxtrain.bench --config=configs/gpt2.py:small --pipeline_parallel 4 --num_devices 4 \
      --batch_size 1 --sequence_length 64 --total_batch_size 512     # 4 layers, 8 microbatches

Memory per device is XLA's own account of the compiled, partitioned step (arguments +
outputs - donated aliases + temporaries), so it is measured on any backend, CPU included.

The bubble: the schedule runs M·V + P - 1 ticks of equal work per stage, M·V of them
useful (train/pipeline.py). Timing the same step with M and with 2M microbatches (the
same rows each, twice the total batch) gives the time of M microbatches' work as
t(2M) - t(M); what t(M) spends beyond that is the bubble plus the fixed part of the step
(the optimizer update and the gradient sums), so the measured share, 2 - t(2M)/t(M), is an
upper bound on the bubble; the schedule's own share (P - 1)/(M·V + P - 1) is printed
beside it. The stages of this SPMD program compute on their idle ticks too (on values
nobody uses), so on fake CPU devices sharing fewer cores the share is of wasted work; on
a busy machine both times are the fastest of alternating steps, and still noisy.
"""

import time

import jax

from jaxtrain.train.pipeline import bubble_fraction


def compiled_memory(compiled) -> dict:
    """Bytes per device of a compiled step, from XLA's memory analysis."""
    stats = compiled.memory_analysis()
    numbers = {
        'argument_bytes': stats.argument_size_in_bytes,
        'output_bytes': stats.output_size_in_bytes,
        'alias_bytes': stats.alias_size_in_bytes,
        'temp_bytes': stats.temp_size_in_bytes,
    }
    numbers['per_device_bytes'] = (
        numbers['argument_bytes'] + numbers['output_bytes'] - numbers['alias_bytes'] + numbers['temp_bytes']
    )
    return numbers


def compile_step(subject):
    """The subject's train step (bench.build), compiled for its state and batch."""
    lowered = subject.parts.train_step.lower(subject.state, subject.inputs_AxBxT, subject.targets_AxBxT)
    return lowered.compile()


def fastest_steps(runs: list, warmup: int, steps: int) -> list[float]:
    """The fastest step's seconds of each (compiled, subject) in `runs`, timed in turns (one
    step of each, `steps` times) so that a busy machine slows them alike; the minimum, not
    the median, is the least disturbed."""
    states = []
    for compiled, subject in runs:
        state, subject.state = subject.state, None  # donated
        for _ in range(warmup):
            state, _ = compiled(state, subject.inputs_AxBxT, subject.targets_AxBxT)
        states.append(jax.block_until_ready(state))
    fastest = [float('inf')] * len(runs)
    for _ in range(steps):
        for i, (compiled, subject) in enumerate(runs):
            began = time.perf_counter()
            states[i], metrics = compiled(states[i], subject.inputs_AxBxT, subject.targets_AxBxT)
            jax.block_until_ready(metrics['loss'])
            fastest[i] = min(fastest[i], time.perf_counter() - began)
    return fastest


def measure(config, warmup: int, steps: int) -> dict:
    """Memory per device and the timed bubble of `config`'s pipelined step ({} without stages)."""
    from jaxtrain.tools.bench_measure import build  # bench imports this module

    stages, virtual = config.pipeline_parallel, config.virtual_pipeline_parallel
    if stages == 1:
        return {}
    runs = []
    for factor in (1, 2):
        doubled = config.copy_and_resolve_references()
        doubled.total_batch_size = config.total_batch_size * factor
        subject = build(doubled)
        runs.append((compile_step(subject), subject))
    microbatches = runs[0][1].geometry.accumulation
    memory = compiled_memory(runs[0][0])
    seconds_m, seconds_2m = fastest_steps(runs, warmup, max(steps, 5))
    return {
        'pipeline_parallel': stages,
        'virtual_pipeline_parallel': virtual,
        'microbatches': microbatches,
        'step_ms_m': 1e3 * seconds_m,
        'step_ms_2m': 1e3 * seconds_2m,
        'bubble_measured': 2 - seconds_2m / seconds_m,
        'bubble_schedule': bubble_fraction(stages, virtual, microbatches),
        **memory,
    }


def report(config, warmup: int, steps: int) -> str:
    """The bench's pipeline block, after a newline ('' without stages)."""
    r = measure(config, warmup, steps)
    if not r:
        return ''
    mib = lambda n: f'{n / 2**20:.2f} MiB'
    return '\n' + '\n'.join(
        [
            f"pipeline       P={r['pipeline_parallel']} V={r['virtual_pipeline_parallel']} "
            f"M={r['microbatches']} microbatches (GPipe)",
            f"  memory/device {mib(r['per_device_bytes'])} (arguments {mib(r['argument_bytes'])}, "
            f"temporaries {mib(r['temp_bytes'])}; XLA's analysis of the compiled step)",
            f"  bubble        measured {100 * r['bubble_measured']:.1f}% "
            f"(fastest step {r['step_ms_m']:.2f} ms with M, "
            f"{r['step_ms_2m']:.2f} ms with 2M: 2 - t(2M)/t(M)); schedule (P-1)/(M·V+P-1) = "
            f"{100 * r['bubble_schedule']:.1f}%",
        ]
    )
