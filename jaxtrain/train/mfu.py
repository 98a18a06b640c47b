"""Model FLOPs utilization of a training run: the FLOPs the model needs per step over what the
devices could do in the step's time.

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

from __future__ import annotations

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
