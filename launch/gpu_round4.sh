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
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxtrain_xla_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
bash .peers/run_peers.sh build "$out/peers" > "$out/peers_build.txt" 2>&1 &
build=$!
until [ -e "$out/peers/llmc_build.log" ] || ! kill -0 $build 2>/dev/null; do sleep 0.5; done
M=(python -m jaxtrain.main --config=configs/gpt2.py:d12 --dtype bfloat16 --batch_size 16 --sequence_length 1024
   --total_batch_size 16384 --scan_layers false --input_bin /tmp/peers_data/train.bin --sample_every 0
   --deterministic false --num_iteration ${STEPS:-80})
B=(python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 --config.batch_size=16
   --config.sequence_length=1024 --config.total_batch_size=16384 --config.scan_layers=false)
loop() {  # loop NAME [flags...]: one run of the real loop (from the tree TREE, default this one)
  local name=$1 tree=${TREE:-$PWD} site=$PWD/.site; shift
  (cd "$tree" && PYTHONPATH="$site:$tree" timeout 200 "${M[@]}" --metrics_dir "$out/$name" "$@") \
    > "$out/$name.txt" 2>&1
  echo "$name exit $? $(python launch/loop_figures.py "$out/$name/metrics.jsonl" 10 16384 2>&1)" >> "$out/figures.txt"
}
peers() {
  wait $build
  timeout 150 bash .peers/run_peers.sh run "$out/peers" 16 2>&1 | grep -v PyTorch > "$out/peers.txt"
  timeout 100 python .peers/plain_jax_step.py 16 >> "$out/peers.txt" 2>&1
}
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
