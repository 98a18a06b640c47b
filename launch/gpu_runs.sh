# What the GPU speed rounds' scripts (gpu_round4.sh, gpu_round5.sh) share; they source it with
# `out` (the output folder) and `default_steps` set. It starts llm.c's build in the background
# (which also writes the random shard the runs read), and defines:
#   M, B      the real loop's and the bench's command lines: GPT-2 124M d12, bf16, batch 16 x 1024,
#             unrolled layers, STEPS (default: default_steps) steps of the loop;
#   intree TREE CMD...    CMD run from TREE's copy of jaxtrain (a `git archive` of another commit);
#   loop NAME [flags...]  one run of the real loop (from the tree TREE, default this one), its
#                         figures (launch/loop_figures.py) appended to $out/figures.txt;
#   profile NAME [flags...]  the bench's kernel profile of the step (from TREE), --json kept;
#   peers     llm.c + cuDNN and the plain JAX step, into $out/peers.txt.
if [ -z "${out:-}" ] || [ -z "${default_steps:-}" ]; then  # run on its own, it would write to /
  echo "gpu_runs.sh: expected to be sourced by gpu_round4.sh or gpu_round5.sh with out and default_steps set" >&2
  return 2 2>/dev/null || exit 2
fi
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxtrain_xla_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
bash .peers/run_peers.sh build "$out/peers" > "$out/peers_build.txt" 2>&1 &  # it also writes the data
build=$!
until [ -e "$out/peers/llmc_build.log" ] || ! kill -0 $build 2>/dev/null; do sleep 0.5; done
M=(python -m jaxtrain.main --config=configs/gpt2.py:d12 --dtype bfloat16 --batch_size 16 --sequence_length 1024
   --total_batch_size 16384 --scan_layers false --input_bin /tmp/peers_data/train.bin --sample_every 0
   --deterministic false --num_iteration ${STEPS:-$default_steps})
B=(python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 --config.batch_size=16
   --config.sequence_length=1024 --config.total_batch_size=16384 --config.scan_layers=false)
site=$PWD/.site
intree() {
  local tree=$1; shift
  (cd "$tree" && PYTHONPATH="$site:$tree" "$@")
}
loop() {
  local name=$1; shift
  intree "${TREE:-$PWD}" timeout 200 "${M[@]}" --metrics_dir "$out/$name" "$@" > "$out/$name.txt" 2>&1
  echo "$name exit $? $(python launch/loop_figures.py "$out/$name/metrics.jsonl" 10 16384 2>&1)" >> "$out/figures.txt"
}
profile() {
  local name=$1; shift
  intree "${TREE:-$PWD}" timeout 150 "${B[@]}" --steps 20 --profile_steps 3 --matmul_size 4096 \
    --json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1
}
peers() {
  wait $build
  timeout 150 bash .peers/run_peers.sh run "$out/peers" 16 2>&1 | grep -v PyTorch > "$out/peers.txt"
  timeout 100 python .peers/plain_jax_step.py 16 >> "$out/peers.txt" 2>&1
}
