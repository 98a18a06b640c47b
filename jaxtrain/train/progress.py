"""What a run prints about itself beside InfiniTrain's step line (which stays as it is, so
that its compare_loss.py reads our logs): the banner before step 1, the progress and summary
lines, and the MFU they report.

The banner (run_banner): model, devices and mesh, batch, optimizer and schedule, data; and the
same facts as one JSON record (run_record) for config.json beside metrics.jsonl.

Progress:

  compiling the train step (step 1's time includes it)...
  progress: step 120/300 (40%) | elapsed 0:01:02 | 2.05 steps/s | ETA 0:01:28 | grad norm 0.8412 | MFU 41.2%
  summary: 300 steps (1-300) | 76,800 tokens | wall 0:02:31 | 540 tokens/s mean | MFU 40.8% | loss final ...

The progress line comes every PROGRESS_EVERY_S seconds of a run (a short run prints
none). Rates leave out this run's first step, which includes the compilation. The gradient
norm (before clipping, as metrics.jsonl's grad_norm) is the last step's. MFU is the last
step's in the progress line and the whole run's in the summary (FLOPs of the timed steps over
their time); it is left out where the device's peak is unknown.

Model FLOPs utilization (MFUMeter): the FLOPs the model needs per step over what the devices
could do in the step's time.

    MFU = training_flops_per_token × tokens per step / (step seconds × devices × peak FLOP/s per device)

training_flops_per_token is the PaLM paper's count (Chowdhury et al. 2022, appendix B), also
nanoGPT's estimate_mfu: 6·N for the forward and backward matmuls with the weights, where N
leaves out the input embeddings (a lookup, no FLOPs: GPT-2's wpe, LLaMA-3's wte; GPT-2's wte is
counted once, as the output head it also is), plus 12·L·T·C for attention's two matmuls
(QKᵀ and AV, with no discount for the causal mask), forward and backward. Rematerialisation
is not counted: this is the model's FLOPs, not the hardware's.

The peak is the device's dense (no sparsity) tensor-core rate for the run's dtype from its data
sheet, looked up by jax's device_kind in PEAK_TFLOPS: bf16, or for float32 TF32, which XLA's
default precision uses for fp32 matmuls on these GPUs. `--peak_tflops` overrides it; a device
not in the table (a CPU) has no MFU unless it is given.
"""

import dataclasses
import time

import jax

from jaxtrain.models.lora import describe as describe_lora
from jaxtrain.optim.optimizer import INFINITRAIN_SCHEDULE_KEYS, schedule_spec
from jaxtrain.parallel import sharding

PROGRESS_EVERY_S = 30.0


def clock_text(seconds: float) -> str:
    seconds = int(round(max(seconds, 0.0)))
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def _steps(count: int) -> str:
    return 'step' if count == 1 else 'steps'


class Progress:
    """Created just before the loop's first step (it prints the compiling line then);
    `step()` after each step's line; `summary()` once the loop is over."""

    def __init__(self, first_step: int, num_steps: int, tokens_per_step: int, report, clock=time.monotonic):
        self.first_step, self.num_steps, self.tokens_per_step = first_step, num_steps, tokens_per_step
        self.report, self.clock = report, clock
        self.began = self._last_line = clock()
        self.steps_done = 0
        self.step_seconds = []  # each step's own time (as the step line shows it)
        self.step_mfu = []  # each step's MFU, None where the peak is unknown
        self.final = None  # (step, loss)
        self.best = None  # (loss, step)
        if first_step < num_steps:
            report(f"compiling the train step (step {first_step + 1}'s time includes it)...")

    def _rate(self) -> float | None:
        """Steps per second of wall time after this run's first step (None before there is one)."""
        if self.steps_done < 2:
            return None
        return (self.steps_done - 1) / max(self.clock() - self._after_first, 1e-9)

    def step(
        self, step: int, loss: float, seconds: float, mfu: float | None = None, grad_norm: float | None = None
    ) -> None:
        self.steps_done += 1
        self.step_mfu.append(mfu)
        if self.steps_done == 1:
            self._after_first = self.clock()
        self.step_seconds.append(seconds)
        self.final = (step, loss)
        if self.best is None or loss < self.best[0]:
            self.best = (loss, step)
        now, rate = self.clock(), self._rate()
        if now - self._last_line < PROGRESS_EVERY_S or step >= self.num_steps or not rate:
            return
        self._last_line = now
        self.report(
            f'progress: step {step}/{self.num_steps} ({100 * step / self.num_steps:.0f}%) | '
            f'elapsed {clock_text(now - self.began)} | {rate:.2f} steps/s | '
            f'ETA {clock_text((self.num_steps - step) / rate)}'
            + (f' | grad norm {grad_norm:.4g}' if grad_norm is not None else '')
            + (f' | MFU {100 * mfu:.1f}%' if mfu else '')
        )

    def summary(self, checkpoints_written: list[int]) -> None:
        if self.steps_done == 0:
            return
        last = self.final[0]
        timed = self.step_seconds[1:]  # without the compiling step
        rate = (
            f'{self.tokens_per_step * len(timed) / max(sum(timed), 1e-9):,.0f} tokens/s mean'
            if timed
            else 'tokens/s n/a (one step, which compiled)'
        )
        timed_mfu = self.step_mfu[1:]
        if timed_mfu and all(timed_mfu):
            # Every step does the same FLOPs, so the run's MFU is the harmonic mean of the steps'.
            rate += f' | MFU {100 * len(timed_mfu) / sum(1 / m for m in timed_mfu):.1f}%'
        saved = (
            f"{len(checkpoints_written)} ({_steps(len(checkpoints_written))} "
            f"{', '.join(map(str, checkpoints_written))})"
            if checkpoints_written
            else '0'
        )
        self.report(
            f'summary: {self.steps_done} {_steps(self.steps_done)} ({last - self.steps_done + 1}-{last}) | '
            f'{self.steps_done * self.tokens_per_step:,} tokens | wall '
            f'{clock_text(self.clock() - self.began)} | '
            f'{rate} | loss final {self.final[1]:.6f}, '
            f'best {self.best[0]:.6f} at step {self.best[1]} | checkpoints written: {saved}'
        )


def run_banner(config, parts, stream, weights: str) -> list[str]:
    """`weights`: where the parameters come from (the model setup's source, or the
    checkpoint a resume restored)."""
    model_config, geometry, devices = parts.setup.model_config, parts.geometry, parts.devices
    setup = parts.setup
    lora = (
        []
        if setup.lora is None
        else [describe_lora(setup.lora, setup.lora_params, model_config.num_parameters)]
    )
    return [
        f'model: {config.model_family} {model_config} | {model_config.num_parameters:,} parameters | '
        f'weights: {weights}',
        f'devices: {len(devices)} x {devices[0].device_kind} ({devices[0].platform}) in '
        f'{jax.process_count()} process(es) | mesh {sharding.describe(parts.mesh)} | '
        f'{sharding.describe_sharded(parts.param_shardings)} | dtype {config.dtype} | '
        f'attention {setup.attention} | cross-entropy {parts.cross_entropy}',
        f'batch: {geometry.describe()}',
        optimizer_line(config),
        stream.describe(),  # 'train data: ...'
    ] + lora


def optimizer_line(config) -> str:
    """'optimizer: adamw | lr 1.00e-04, constant | β1 0.9, β2 0.95, eps 1e-08 | weight decay 0.1 ...'"""
    parts = [f'optimizer: {config.optimizer}', f'lr {config.learning_rate:.2e}, {schedule_text(config)}']
    if config.optimizer in ('adamw', 'adam'):
        parts.append(f'β1 {config.beta1:g}, β2 {config.beta2:g}, eps {config.eps:g}')
    if config.optimizer == 'adamw':  # optimizer.decay_mask: llm.c's rule
        parts.append(f'weight decay {config.weight_decay:g} (tensors of 2+ dimensions)')
    else:
        parts.append('no weight decay')
    parts.append(f'grad clip {config.grad_clip:g}' if config.grad_clip > 0 else 'no grad clip')
    return ' | '.join(parts)


def schedule_text(config) -> str:
    """The schedule in the spelling the run used: jaxtrain's keys, or InfiniTrain's (optim.schedule_spec)."""
    theirs = any(config.get(key, default) != default for key, default in INFINITRAIN_SCHEDULE_KEYS.items())
    if theirs:
        spec = schedule_spec(config)
        text = f"InfiniTrain's {spec.style}"
        if spec.warmup_iters:
            text += f', warmup {spec.warmup_iters} steps from {spec.warmup_init:.2e}'
        if spec.style in ('linear', 'cosine'):
            text += f' to min_lr {spec.min_lr:.2e} at step {spec.decay_iters}'
        return text
    text = config.lr_schedule
    if config.warmup_steps:
        text += f", after llm.c's linear warmup of {config.warmup_steps} steps"
    if config.lr_schedule == 'cosine':
        text += f' to {config.min_lr_ratio:g} x lr at step {config.num_iteration}'
    return text


def run_record(config, parts, weights: str) -> dict:
    """The whole resolved run (every key after flags, the model the weights fit, the batch), as
    written to config.json: a run that saves no checkpoint still records what it was."""
    setup, geometry, devices = parts.setup, parts.geometry, parts.devices
    return {
        'config': config.to_dict(),
        'model_family': config.model_family,
        'model_config': dataclasses.asdict(setup.model_config),
        'num_parameters': setup.model_config.num_parameters,
        'weights': weights,
        'batch': {**dataclasses.asdict(geometry), 'tokens_per_step': geometry.tokens_per_step},
        'optimizer': optimizer_line(config).removeprefix('optimizer: '),
        'devices': {'count': len(devices), 'platform': devices[0].platform, 'kind': devices[0].device_kind},
        'process_count': jax.process_count(),
    }


# device_kind substring -> (bf16 dense TFLOP/s, fp32 matmul as TF32 dense TFLOP/s). The first match wins,
# so the longer names come first.
PEAK_TFLOPS = (
    ('H100 PCIe', (756.0, 378.0)),
    ('GH200', (989.4, 494.7)),  # before 'H200', which its name contains
    ('H200', (989.4, 494.7)),
    ('H100', (989.4, 494.7)),
    ('H800', (989.4, 494.7)),
    ('B200', (2250.0, 1100.0)),
    ('A100', (312.0, 156.0)),
    ('A800', (312.0, 156.0)),
    ('L40S', (362.0, 183.0)),
    ('L40', (181.0, 90.5)),  # before 'L4', which its name contains
    ('A10G', (70.0, 35.0)),
    ('L4', (121.0, 60.0)),
    ('TPU v6', (918.0, 918.0)),
    ('TPU v5p', (459.0, 459.0)),
    ('TPU v5', (197.0, 197.0)),  # v5e ('TPU v5 lite')
    ('TPU v4', (275.0, 275.0)),
)


def non_embedding_parameters(family: str, model_config) -> int:
    """N of the count: every parameter but the input embedding lookups."""
    C = model_config.channels
    if family == 'gpt2':
        return model_config.num_parameters - model_config.max_seq_len * C  # wpe
    if model_config.tie_embeddings:  # the one tensor is the head's matmul, as GPT-2's wte is
        return model_config.num_parameters
    return model_config.num_parameters - model_config.vocab_size * C  # wte (lm_head stays)


def training_flops_per_token(family: str, model_config, seq_len: int) -> int:
    L, C = model_config.num_layers, model_config.channels
    return 6 * non_embedding_parameters(family, model_config) + 12 * L * seq_len * C


def peak_row(device_kind: str) -> str | None:
    """The PEAK_TFLOPS name that device_kind matches (the first it contains); None if none."""
    for name, _ in PEAK_TFLOPS:
        if name.lower() in device_kind.lower():
            return name
    return None


def peak_flops_per_device(device_kind: str, dtype: str, override_tflops: float = 0.0) -> float | None:
    """FLOP/s of one device: --peak_tflops when given, else the table's; None when not known."""
    if override_tflops > 0:
        return override_tflops * 1e12
    name = peak_row(device_kind)
    if name is None:
        return None
    bf16, fp32 = dict(PEAK_TFLOPS)[name]
    return (bf16 if dtype == 'bfloat16' else fp32) * 1e12


class MFUMeter:
    """MFU of a step from its seconds; `of()` is None when the peak is unknown."""

    def __init__(self, family, model_config, seq_len, tokens_per_step, devices, dtype, override_tflops=0.0):
        self.flops_per_step = training_flops_per_token(family, model_config, seq_len) * tokens_per_step
        kinds = {d.device_kind for d in devices}
        self.device_kind = ', '.join(sorted(kinds))
        per_device = peak_flops_per_device(self.device_kind, dtype, override_tflops)
        self.peak_flops = None if per_device is None else per_device * len(devices)

    def of(self, seconds: float) -> float | None:
        if self.peak_flops is None or seconds <= 0:
            return None
        return self.flops_per_step / (seconds * self.peak_flops)
