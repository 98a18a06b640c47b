#!/usr/bin/env bash
# GPU speed, round four (BENCHMARKS.md), in ONE device call so that every figure is a ratio to the
# peers measured beside it (llm.c + cuDNN, the plain JAX step; .peers/ as in gpu_round3.sh).
# GPT-2 124M d12, bf16, batch 16 x 1024, no accumulation, llm.c's random shard.
# usage: launch/gpu_round4.sh OUT_DIR [kernels|saves|final]
#   kernels: the loss kernel alone (launch/cross_entropy_bench.py); the real loop with
#            --cross_entropy xla and auto (Pallas), fast and deterministic, and fast with
#            Pallas attention (what the deterministic flag costs beside the kernel); the bench's
#            kernel profile; the peers.
#   saves:   the loss kernel alone, then the real loop without saves and saving every 20 and 50
#            steps into /tmp and /dev/shm.
#   final:   the figures of BENCHMARKS.md round four: the loop fast (Pallas loss, and XLA's),
#            deterministic, saving every 20 steps into /dev/shm and every 50 into /tmp; the peers; the bench's
#            kernel profile (--json keeps every kernel); LLaMA-3 1B's bench with either loss
#            (LLAMA=0 leaves it out). OUT_DIR.tgz holds every file of the call.
set -uo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ]; then sed -n '2,15p' "$0"; exit 2; fi
out=$(realpath -m "$1"); what=${2:-kernels}; mkdir -p "$out"
default_steps=80
source launch/gpu_runs.sh  # M, B, intree, loop, profile, peers; starts llm.c's build
if [ "$what" = kernels ]; then
  timeout 120 python launch/cross_entropy_bench.py > "$out/xent_kernel.txt" 2>&1
  loop fast_xla --cross_entropy xla
  loop fast_pallas --cross_entropy auto
  loop det_xla --cross_entropy xla --deterministic true
  loop det_pallas --cross_entropy auto --deterministic true
  loop fast_pallas_attention --cross_entropy auto --attention pallas
  peers
  loop fast_pallas_again --cross_entropy auto
  timeout 120 "${B[@]}" --steps 20 --profile_steps 3 --matmul_size 4096 > "$out/bench_profile.txt" 2>&1
elif [ "$what" = saves ]; then
  timeout 120 python launch/cross_entropy_bench.py > "$out/xent_kernel.txt" 2>&1
  loop fast
  loop save20_tmp --checkpoint_dir /tmp/ck20 --save_steps 20 --max_checkpoint_keep 2
  loop save20_shm --checkpoint_dir /dev/shm/ck20 --save_steps 20 --max_checkpoint_keep 2; rm -rf /dev/shm/ck20
  loop save50_tmp --checkpoint_dir /tmp/ck50 --save_steps 50 --max_checkpoint_keep 2
  peers
elif [ "$what" = final ]; then
  loop fast
  # Round three's code as it landed (git archive 8a65750 jaxtrain configs llmc_io, in .round3).
  [ -d .round3 ] && TREE=$PWD/.round3 loop round3
  loop fast_xla --cross_entropy xla
  loop deterministic --deterministic true
  loop save20_shm --checkpoint_dir /dev/shm/ck20 --save_steps 20 --max_checkpoint_keep 2; rm -rf /dev/shm/ck20
  loop save50_tmp --checkpoint_dir /tmp/ck50 --save_steps 50 --max_checkpoint_keep 2
  peers
  loop fast_again
  timeout 120 "${B[@]}" --steps 20 --profile_steps 3 --matmul_size 4096 --json "$out/bench_profile.json" \
    > "$out/bench_profile.txt" 2>&1
  [ "${LLAMA:-1}" = 0 ] && L=() || L=(--config=configs/llama3.py:llama3.2-1b --config.dtype=bfloat16 --config.batch_size=4 --config.sequence_length=2048
     --config.total_batch_size=8192 --config.scan_layers=false --steps 10)
  if [ ${#L[@]} -gt 0 ]; then
    timeout 150 python -m jaxtrain.bench "${L[@]}" > "$out/bench_llama.txt" 2>&1
    timeout 150 python -m jaxtrain.bench "${L[@]}" --config.cross_entropy=xla > "$out/bench_llama_xla.txt" 2>&1
  fi
fi
# Everything in one file, since a device call brings back only so many.
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cat "$out/peers.txt" "$out/figures.txt" "$out/xent_kernel.txt" 2>/dev/null
grep -h "jaxtrain.bench\|median\|kernels\|MFU" "$out"/bench*.txt 2>/dev/null | head -20
