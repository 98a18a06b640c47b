#!/usr/bin/env bash
# GPU speed, round three (BENCHMARKS.md), in ONE device call so that every figure is a ratio to
# the peers measured beside it: llm.c + cuDNN and PyTorch (peers/run_peers.sh) and the plain JAX
# step (peers/plain_jax_step.py), GPT-2 124M d12, bf16, batch 16 x 1024, no accumulation.
# usage: launch/gpu_round3.sh OUT_DIR [loop|levers|llama]   (the peers folder copied to ./.peers)
#   loop:   the real loop (python -m jaxtrain.main) without and with a save every 20 steps, the
#           loop as it was before round three (.peers/old_loop.py), jaxtrain.bench fast vs
#           deterministic with saves; per run OUT_DIR/figures.txt has launch/loop_figures.py's line.
#   levers: the real loop under XLA flag rows, in deterministic mode, saving every 20 steps (/tmp and
#           /dev/shm) and every 50; then the peers and the bench's kernel profile of the fast step.
#   llama:  LLaMA-3 1B on one GPU: the bench (MFU) and the real loop, then the peers.
set -uo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ]; then sed -n '2,10p' "$0"; exit 2; fi
out=$(realpath -m "$1"); what=${2:-loop}; mkdir -p "$out"
# Compiled programs are shared between the runs of this call (same step, same flags: one compile).
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxtrain_xla_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
stamp() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN{printf "%.2f", b - a}'; }
# llm.c builds on the CPU (about 90 s) while jaxtrain uses the GPU; its random shard comes first.
bash .peers/run_peers.sh build "$out/peers" > "$out/peers_build.txt" 2>&1 &
build=$!
until [ -e "$out/peers/llmc_build.log" ] || ! kill -0 $build 2>/dev/null; do sleep 0.5; done
data=/tmp/peers_data/train.bin
M=(python -m jaxtrain.main --config=configs/gpt2.py:d12 --dtype bfloat16 --batch_size 16 --sequence_length 1024
   --total_batch_size 16384 --scan_layers false --input_bin $data --deterministic false --num_iteration 100)
B=(python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 --config.batch_size=16
   --config.sequence_length=1024 --config.total_batch_size=16384 --config.scan_layers=false)
repo=$PWD; site=$PWD/.site
loop() {  # loop NAME TREE [flags...]: one run of the real loop from TREE, its figures and wall time
  local name=$1 tree=$2; shift 2; local began; began=$(stamp)
  (cd "$tree" && PYTHONPATH="$site:$tree" timeout 240 "${M[@]}" --metrics_dir "$out/$name" "$@") \
    > "$out/$name.txt" 2>&1
  echo "exit $? after $(since "$began") s" >> "$out/$name.txt"
  echo "$name $(python launch/loop_figures.py "$out/$name/metrics.jsonl" 10 "${TOKENS:-16384}" 2>&1)" \
    >> "$out/figures.txt"
}
peers() {  # the peers, once the build is done
  wait $build
  timeout 200 bash .peers/run_peers.sh run "$out/peers" 16 > "$out/peers.txt" 2>&1
  timeout 100 python .peers/plain_jax_step.py 16 >> "$out/peers.txt" 2>&1
}
if [ "$what" = loop ]; then
  rm -rf /tmp/oldtree && mkdir -p /tmp/oldtree && cp -r jaxtrain configs llmc_io /tmp/oldtree/
  cp .peers/old_loop.py /tmp/oldtree/jaxtrain/train/loop.py
  loop loop_fast "$repo"
  loop loop_old /tmp/oldtree
  loop loop_save20 "$repo" --checkpoint_dir /tmp/ck_save20 --save_steps 20 --max_checkpoint_keep 2
  loop loop_fast_again "$repo"
  peers
  timeout 330 "${B[@]}" --steps 60 --save_every 20 --compare_deterministic --json "$out/bench.json" \
    > "$out/bench.txt" 2>&1; echo "exit $?" >> "$out/bench.txt"
elif [ "$what" = levers ]; then
  # Rows of the real loop, 200 steps each: XLA flag levers, deterministic mode, and saves (every 20
  # steps into /tmp and into /dev/shm, every 50 into /tmp), then the bench's kernel profile.
  df -h /tmp /dev/shm > "$out/df.txt" 2>&1
  dd if=/dev/zero of=/tmp/dd_probe bs=1M count=1400 conv=fdatasync 2> "$out/dd_tmp.txt"; rm -f /tmp/dd_probe
  loop lever_base "$repo" --num_iteration 200
  XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true loop lever_lhs "$repo" --num_iteration 200
  XLA_FLAGS=--xla_gpu_enable_command_buffer= loop lever_no_cmdbuf "$repo" --num_iteration 200
  XLA_FLAGS=--xla_gpu_enable_cublaslt=true loop lever_cublaslt "$repo" --num_iteration 200
  loop loop_deterministic "$repo" --num_iteration 200 --deterministic true
  loop save20_tmp "$repo" --num_iteration 200 --checkpoint_dir /tmp/ck20 --save_steps 20 --max_checkpoint_keep 2
  loop save20_shm "$repo" --num_iteration 200 --checkpoint_dir /dev/shm/ck20 --save_steps 20 --max_checkpoint_keep 2
  rm -rf /dev/shm/ck20
  loop save50_tmp "$repo" --num_iteration 200 --checkpoint_dir /tmp/ck50 --save_steps 50 --max_checkpoint_keep 2
  loop lever_base_again "$repo" --num_iteration 200
  peers
  timeout 150 "${B[@]}" --steps 20 --profile_steps 3 --matmul_size 4096 > "$out/bench_profile.txt" 2>&1
elif [ "$what" = llama ]; then
  # LLaMA-3 1B (L16, C2048, T2048) on one GPU, round two's shape: the bench (MFU by llm.c's count)
  # and the real loop on random uint32 ids (< 128256), 60 steps.
  python -c "import numpy as np, llmc_io; llmc_io.write_shard('/tmp/llama_train.bin', \
np.random.default_rng(0).integers(0, 128256, 4_000_000).astype(np.uint32), kind='llama3')"
  L=(--config.dtype=bfloat16 --config.batch_size=4 --config.sequence_length=2048 --config.total_batch_size=8192
     --config.scan_layers=false)
  timeout 200 python -m jaxtrain.bench --config=configs/llama3.py:llama3.2-1b "${L[@]}" --steps 10 \
    --json "$out/bench_llama.json" > "$out/bench_llama.txt" 2>&1
  M=(python -m jaxtrain.main --config=configs/llama3.py:llama3.2-1b "${L[@]}" --input_bin /tmp/llama_train.bin
     --deterministic false --num_iteration 60)
  TOKENS=8192 loop loop_llama "$repo"
  peers
fi
cat "$out/peers.txt" "$out/figures.txt" 2>/dev/null; grep -h "median\|ratio\|blocked\|phase\|throughput\|peak\|kernels" "$out"/bench*.txt 2>/dev/null
