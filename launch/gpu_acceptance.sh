#!/usr/bin/env bash
# The GPU acceptance record (BENCHMARKS.md): the seed experiment for GPT-2 124M (fp32, bf16)
# and LLaMA-3 `small` (fp32, bf16), all bitwise, then the benchmark of fast vs deterministic
# mode with saves. usage: launch/gpu_acceptance.sh OUT_DIR   (results: OUT_DIR/*.txt)
set -uo pipefail
if [ $# -ne 1 ] || [ "$1" = "--help" ]; then sed -n '2,4p' "$0"; exit 2; fi
out=$1; work=${WORK:-/tmp/acceptance}; mkdir -p "$out" "$work"
python - <<'PY'
# LLaMA-3 needs a uint32 shard: the built-in corpus's ids (all < 50257) re-encoded.
import numpy as np, llmc_io
from jaxtrain.data.default_corpus import ensure_default_corpus
train, _ = ensure_default_corpus()
llmc_io.write_shard('/tmp/acceptance_llama_train.bin', np.asarray(llmc_io.read_shard(train)).astype(np.uint32), kind='llama3')
PY
for case in "gpt2.py:d12 float32" "gpt2.py:d12 bfloat16" "llama3.py:small float32" "llama3.py:small bfloat16"; do
  set -- $case
  extra=(); [[ $1 == llama3* ]] && extra=(--input_bin /tmp/acceptance_llama_train.bin)
  name="${1%%.*}_$2"
  start=$(date +%s)
  launch/seed_experiment.sh "$work/$name" "configs/$1" --dtype "$2" "${extra[@]}" > "$out/seed_$name.txt" 2>&1
  echo "exit $? in $(( $(date +%s) - start )) s" >> "$out/seed_$name.txt"
  grep -h "step   4[01]/\|step  100/" "$work/$name"/base/*.log "$work/$name"/test/*.log >> "$out/seed_$name.txt"
done
python -m jaxtrain.bench --config=configs/gpt2.py:d12 --config.dtype=bfloat16 --config.batch_size=16 \
  --config.sequence_length=1024 --config.total_batch_size=16384 --steps 90 --save_every 30 \
  --compare_deterministic --json "$out/bench.json" > "$out/bench.txt" 2>&1
