#!/usr/bin/env bash
# GPU check of the fused Pallas kernels (--fused_kernels; jaxtrain/models/layernorm_kernel.py,
# bias_gelu_kernel.py). Run from the repository root (bench/figures.py --figures fused_kernels does) as
#   export PYTHONPATH=$PWD;  bash bench/fused_kernels.sh [OUT]      (OUT default /tmp/fused_kernels)
# with $PYTHON the interpreter (default: python). About 3-4 min on an H200 (mostly the compiles of
# the real loop: 6 runs); FUSED_KERNELS_QUICK=1 leaves out the two single-kernel runs (layernorm,
# bias_gelu), which come last. One line per result:
#   micro ...   kernel vs XLA at GPT-2 124M shapes (16384 x 768 / 3072, bf16), fwd and fwd+bwd,
#               each Pallas tile config tried, the GPU-vs-XLA max error, a bitwise-repeat check
#   loop ...    the real loop (d12 bf16 B16 T1024, unrolled), median step_ms from step 11 on,
#               --fused_kernels none/all fast, none/all --deterministic true, layernorm/bias_gelu fast
# Knobs for a CPU dry run of this script's logic (tests nothing about speed):
#   FUSED_KERNELS_CPU=1  tiny shapes, tiny model, Pallas' interpreter (JAXTRAIN_PALLAS_INTERPRET=1)
# A failed part prints a line with FAILED and makes the script exit 1 at the end.
set -u -o pipefail
PYTHON=${PYTHON:-python}
FAILED=0
OUT=${1:-/tmp/fused_kernels}
mkdir -p "$OUT"
START=$(date +%s)
if [ "${FUSED_KERNELS_CPU:-0}" = 1 ]; then
  export JAXTRAIN_PALLAS_INTERPRET=1
  MODEL=(--config=configs/gpt2.py:tiny --batch_size 2 --sequence_length 64 --total_batch_size 128)
  STEPS=13
  KINDS=(fast:none fast:all det:all)
else
  MODEL=(--config=configs/gpt2.py:d12 --batch_size 16 --sequence_length 1024 --total_batch_size 16384)
  STEPS=60
  KINDS=(fast:none fast:all det:none det:all)
  [ "${FUSED_KERNELS_QUICK:-0}" = 1 ] || KINDS+=(fast:layernorm fast:bias_gelu)
fi

echo "== micro-benchmarks ($(date +%T))"
"$PYTHON" - <<'PY' 2>&1 | { grep -v -e '^WARNING' -e 'DeprecationWarning' || true; }
import os, time

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain.models import bias_gelu_kernel as bg
from jaxtrain.models import layernorm_kernel as lnk
from jaxtrain.models.gpt2 import gelu_tanh

cpu = os.environ.get('FUSED_KERNELS_CPU') == '1'
N, C = (256, 64) if cpu else (16384, 768)
F = 4 * C
REPS = 2 if cpu else 50
print(f'micro backend {jax.default_backend()} {jax.devices()[0].device_kind}: N {N} C {C} F {F} bf16',
      flush=True)


def timed(fn, *args):
    """ms a call: back-to-back calls after a warm-up, the device's time when it is the bound."""
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    began = time.perf_counter()
    for _ in range(REPS):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - began) / REPS * 1e3


def configure(module, **values):
    """Sets a kernel module's tile constants; jax caches traces, which read them, so clear those."""
    for name, value in values.items():
        setattr(module, name, value)
    jax.clear_caches()


def max_rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def same_bits(a, b):
    return all(np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32), equal_nan=True)
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


rng = np.random.default_rng(0)
bf = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)

# --- residual add + LayerNorm: XLA as gpt2.py computes it (flax's nnx.LayerNorm in fp32) ------
x, r, ds, dy = bf(N, C), bf(N, C), bf(N, C), bf(N, C)
scale, bias = 1 + 0.1 * f32(C), f32(C)


def xla_add_ln(x, r, scale, bias):
    s = x + r
    s32 = s.astype(jnp.float32)
    mean = s32.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (s32 * s32).mean(-1, keepdims=True) - mean * mean)
    y = (s32 - mean) * (jax.lax.rsqrt(var + 1e-5) * scale) + bias
    return s, y.astype(x.dtype)


def both(f):
    """f's outputs and the gradients of every input, for the cotangents (ds, dy)."""
    def run(x, r, scale, bias, ds, dy):
        out, vjp = jax.vjp(f, x, r, scale, bias)
        return out, vjp((ds, dy))
    return jax.jit(run)


args = (x, r, scale, bias, ds, dy)
xla_f = timed(jax.jit(xla_add_ln), x, r, scale, bias)
xla_fb = timed(both(xla_add_ln), *args)
want = both(xla_add_ln)(*args)
print(f'micro add_layernorm xla: fwd {xla_f:.4f} ms, fwd+bwd {xla_fb:.4f} ms', flush=True)
best_f = None
for rows, warps in [(1, 4), (2, 4), (4, 4), (8, 4), (8, 8), (16, 8)]:
    configure(lnk, FORWARD_ROWS=rows, FORWARD_WARPS=warps)
    ms = timed(jax.jit(lambda *a: lnk.add_layernorm(*a)), x, r, scale, bias)
    print(f'micro add_layernorm pallas fwd rows {rows} warps {warps}: {ms:.4f} ms '
          f'({xla_f / ms:.2f}x xla)', flush=True)
    if best_f is None or ms < best_f[0]:
        best_f = (ms, rows, warps)
configure(lnk, FORWARD_ROWS=best_f[1], FORWARD_WARPS=best_f[2])
best_fb = None
for rows, group, warps in [(1, 64, 4), (2, 32, 4), (4, 16, 4), (4, 32, 4), (8, 8, 8), (8, 16, 8),
                           (16, 4, 8)]:
    configure(lnk, BACKWARD_ROWS=rows, BACKWARD_GROUP=group, BACKWARD_WARPS=warps)
    run = both(lnk.add_layernorm)
    ms = timed(run, *args)
    got = run(*args)
    errors = ' '.join(f'{max_rel(g, w):.1e}' for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    print(f'micro add_layernorm pallas fwd+bwd rows {rows} group {group} warps {warps}: {ms:.4f} ms '
          f'({xla_fb / ms:.2f}x xla); max rel err vs xla (s y dx dr dscale dbias) {errors}', flush=True)
    if best_fb is None or ms < best_fb[0]:
        best_fb = (ms, rows, group, warps)
configure(lnk, BACKWARD_ROWS=best_fb[1], BACKWARD_GROUP=best_fb[2], BACKWARD_WARPS=best_fb[3])
run = both(lnk.add_layernorm)
print(f'micro add_layernorm best: fwd {best_f[0]:.4f} ms (rows, warps {best_f[1:]}), '
      f'fwd+bwd {best_fb[0]:.4f} ms (rows, group, warps {best_fb[1:]}) = {xla_fb / best_fb[0]:.2f}x xla; '
      f'bitwise repeat {same_bits(run(*args), run(*args))}', flush=True)

# --- bias + GELU, alone and after c_fc's matmul (where XLA may fuse them into the GEMM) --------
pre, dout, xin = bf(N, F), bf(N, F), bf(N, C)
w = jnp.asarray(0.03 * rng.standard_normal((C, F)), jnp.bfloat16)
b = 0.1 * f32(F)
xla_gelu = lambda pre, b: gelu_tanh(pre + b.astype(pre.dtype))  # nnx.Linear adds a bf16 bias


def grads_of(f):
    def run(p, b, dout):
        out, vjp = jax.vjp(f, p, b)
        return out, vjp(dout)
    return jax.jit(run)


def with_matmul(gelu):
    def run(xin, w, b, dout):
        out, vjp = jax.vjp(lambda xin, w, b: gelu(xin @ w, b), xin, w, b)
        return out, vjp(dout)
    return jax.jit(run)


xla_f = timed(jax.jit(xla_gelu), pre, b)
xla_fb = timed(grads_of(xla_gelu), pre, b, dout)
xla_mm = timed(with_matmul(xla_gelu), xin, w, b, dout)
want = grads_of(xla_gelu)(pre, b, dout)
print(f'micro bias_gelu xla: fwd {xla_f:.4f} ms, fwd+bwd {xla_fb:.4f} ms, '
      f'with c_fc matmul fwd+bwd {xla_mm:.4f} ms', flush=True)
best_f = None
for rows, cols, warps in [(8, 512, 4), (16, 256, 4), (4, 1024, 4), (16, 512, 8), (32, 256, 8), (8, 1024, 8)]:
    configure(bg, FORWARD_ROWS=rows, FORWARD_COLS=cols, FORWARD_WARPS=warps)
    ms = timed(jax.jit(lambda *a: bg.bias_gelu(*a)), pre, b)
    print(f'micro bias_gelu pallas fwd rows {rows} cols {cols} warps {warps}: {ms:.4f} ms '
          f'({xla_f / ms:.2f}x xla)', flush=True)
    if best_f is None or ms < best_f[0]:
        best_f = (ms, rows, cols, warps)
configure(bg, FORWARD_ROWS=best_f[1], FORWARD_COLS=best_f[2], FORWARD_WARPS=best_f[3])
best_fb = None
for rows, cols, group, warps in [(8, 512, 8, 4), (16, 256, 8, 4), (8, 1024, 4, 8), (4, 512, 16, 4),
                                 (16, 512, 8, 8), (32, 256, 4, 8)]:
    configure(bg, BACKWARD_ROWS=rows, BACKWARD_COLS=cols, BACKWARD_GROUP=group, BACKWARD_WARPS=warps)
    run = grads_of(bg.bias_gelu)
    ms = timed(run, pre, b, dout)
    got = run(pre, b, dout)
    errors = ' '.join(f'{max_rel(g, w):.1e}' for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    print(f'micro bias_gelu pallas fwd+bwd rows {rows} cols {cols} group {group} warps {warps}: {ms:.4f} ms '
          f'({xla_fb / ms:.2f}x xla); max rel err vs xla (out dpre dbias) {errors}', flush=True)
    if best_fb is None or ms < best_fb[0]:
        best_fb = (ms, rows, cols, group, warps)
configure(bg, BACKWARD_ROWS=best_fb[1], BACKWARD_COLS=best_fb[2], BACKWARD_GROUP=best_fb[3],
          BACKWARD_WARPS=best_fb[4])
mm = timed(with_matmul(bg.bias_gelu), xin, w, b, dout)
run = grads_of(bg.bias_gelu)
print(f'micro bias_gelu best: fwd {best_f[0]:.4f} ms (rows, cols, warps {best_f[1:]}), '
      f'fwd+bwd {best_fb[0]:.4f} ms (rows, cols, group, warps {best_fb[1:]}) = '
      f'{xla_fb / best_fb[0]:.2f}x xla; with c_fc matmul {mm:.4f} ms = {xla_mm / mm:.2f}x xla; '
      f'bitwise repeat {same_bits(run(pre, b, dout), run(pre, b, dout))}', flush=True)
PY
rc=$?
if [ $rc -ne 0 ]; then
  echo "micro FAILED (exit $rc)"; FAILED=1
fi
echo "micro done in $(( $(date +%s) - START )) s"

WRITE_SHARD='import sys; sys.path.insert(0, "."); from bench.figures import _write_shard; _write_shard()'
if ! "$PYTHON" -c "$WRITE_SHARD"; then
  echo "FAILED: could not write /tmp/jaxtrain_bench/train.bin"; exit 1
fi

# median step_ms from step 11 on, the last loss, from a run's metrics.jsonl
summary() {
  "$PYTHON" - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
steps = {r['step']: r for r in rows if 'step_ms' in r and 'loss' in r}
after = [steps[s]['step_ms'] for s in sorted(steps) if s >= 11]
last = max(steps)
print(f'median step_ms {statistics.median(after):.3f} over steps 11-{last} ({len(after)} steps); '
      f'loss step 1 {steps[min(steps)]["loss"]:.6f}, step {last} {steps[last]["loss"]:.6f}')
PY
}

loop() {  # loop NAME DETERMINISTIC FUSED
  local name=$1 began=$(date +%s)
  "$PYTHON" -m jaxtrain.main "${MODEL[@]}" --dtype bfloat16 --scan_layers false --sample_every 0 \
    --deterministic "$2" --fused_kernels "$3" --input_bin /tmp/jaxtrain_bench/train.bin \
    --num_iteration "$STEPS" --metrics_dir "$OUT/$name" > "$OUT/$name.txt" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$OUT/$name/metrics.jsonl" ]; then
    echo "loop $name: FAILED (exit $rc); last lines of $OUT/$name.txt:"; tail -5 "$OUT/$name.txt"
    FAILED=1; return
  fi
  local figures
  if ! figures=$(summary "$OUT/$name/metrics.jsonl"); then
    echo "loop $name: FAILED (no step_ms in $OUT/$name/metrics.jsonl)"; FAILED=1; return
  fi
  echo "loop $name (deterministic $2, fused_kernels $3): $figures; $(( $(date +%s) - began )) s"
}

echo "== real loop ($(date +%T))"
for kind in "${KINDS[@]}"; do
  mode=${kind%%:*} fused=${kind#*:}
  loop "$mode-$fused" "$([ "$mode" = det ] && echo true || echo false)" "$fused"
done
echo "== done in $(( $(date +%s) - START )) s; logs and metrics under $OUT"
[ "$FAILED" = 0 ] || { echo "FAILED: see the lines above"; exit 1; }
