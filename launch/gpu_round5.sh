#!/usr/bin/env bash
# GPU speed, rounds five and six (BENCHMARKS.md), in ONE device call so that every figure is a ratio to the
# peers measured beside it (llm.c + cuDNN, the plain JAX step). .peers/ is not in the repository:
# copy ../shared/peers there (ignored by git) and carry it to the GPU machine, as gpu_round3.sh says.
# GPT-2 124M d12, bf16, batch 16 x 1024, no accumulation, llm.c's random shard, 110 steps.
# usage: launch/gpu_round5.sh OUT_DIR [probe|probe2|deterministic|probe3|saves|check|flags|final]
#   probe: the real loop fast and deterministic, from this tree and from each variant tree named
#          in VARIANTS (default .variant_split: a `git archive` of a branch, see BENCHMARKS.md);
#          where a save's cost comes from (launch/save_cost_probe.py); the loop saving every 20
#          steps into /dev/shm; the peers; kernel profiles of the fast and the deterministic step
#          of the first variant (the bench's, --json keeps every kernel); attention_bench.
#   probe2: the loop deterministic from this tree and each variant, twice each (are the losses
#          bitwise equal?); the save probe's pinned-host-memory modes; the peers.
#   deterministic: launch/cudnn_deterministic_probe.py where it exists; the loop fast,
#          deterministic twice (bitwise compared), and deterministic from each variant tree; no
#          peers (the ratios are to the fast loop beside them).
#   probe3 (round six): the loop fast from this tree, from each variant tree, and with each
#          XLA_FLAGS value of XFLAGS (';'-separated); the save probe's modes PROBE_MODES; no peers
#          (the ratios are to the fast loop beside them).
#   saves (round six): the loop fast, then saving every 20 steps into /dev/shm from this tree and
#          from each variant tree, twice each; no peers.
#   check (round six): the loop fast, deterministic, the peers, fast again; LLaMA-3 1B's bench
#          from this tree and from each variant tree.
#   flags: the seed experiment, then the loop fast, and again with each XLA_FLAGS value of
#          XFLAGS (separated by ';'); no peers.
#   final: the figures of BENCHMARKS.md round five from this tree: the loop fast (twice),
#          deterministic, saving every 20 steps into /dev/shm (also from each variant tree);
#          the peers; the fast step's kernel profile; the seed experiment (bit-exact resume)
#          in the deterministic mode; LLaMA-3 1B's bench (LLAMA=0 leaves it out).
# OUT_DIR.tgz holds every file of the call.
set -uo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then  # the header above
  awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; [ $# -lt 1 ] && exit 2; exit 0
fi
what=${2:-probe}
case "$what" in
  probe|probe2|deterministic|probe3|saves|check|flags|final) ;;
  *) echo "gpu_round5.sh: expected a plan of probe, probe2, deterministic, probe3, saves, check, flags or final; found '$what'" >&2; exit 2 ;;
esac
[ -d .peers ] || { echo "gpu_round5.sh: expected .peers/ here (a copy of ../shared/peers); found none" >&2; exit 2; }
out=$(realpath -m "$1"); mkdir -p "$out"
default_steps=110
source launch/gpu_runs.sh  # M, B, intree, loop, profile, peers; starts llm.c's build
seed_experiment() {
  # Bit-exact resume in the deterministic GPU mode (unrolled; cuDNN attention with distinct calls
  # since round six, Pallas' before; the Pallas loss): 100 steps saving every 20, a second run
  # resumed from step 40 (BENCHMARKS.md, issue 4).
  STEPS=100 timeout 200 launch/seed_experiment.sh /tmp/seed_deterministic configs/gpt2.py:d12 --dtype bfloat16 \
    --batch_size 8 --sequence_length 1024 --total_batch_size 8192 --scan_layers false \
    > "$out/seed_deterministic.txt" 2>&1
  echo "seed experiment exit $?" >> "$out/seed_deterministic.txt"
}
save20() {  # NAME: the loop saving every 20 steps into /dev/shm, keeping 2 (from TREE)
  local name=$1; shift
  loop "$name" --checkpoint_dir /dev/shm/ck20 --save_steps 20 --max_checkpoint_keep 2 "$@"; rm -rf /dev/shm/ck20
}
flag_rows() {  # the loop fast once per XLA_FLAGS value of XFLAGS (';'-separated)
  local rows i
  IFS=';' read -ra rows <<< "${XFLAGS:-}"
  for i in "${!rows[@]}"; do
    XLA_FLAGS="${rows[$i]}" loop "fast_flags$i"; echo "fast_flags$i: ${rows[$i]}" >> "$out/figures.txt"
  done
}
same_losses() {  # RUN: did RUN and RUN_again give bitwise equal losses? (into figures.txt)
  python - "$out/$1" "$out/${1}_again" >> "$out/figures.txt" <<'PY'
import json, sys
losses = [[json.loads(l).get('loss') for l in open(f'{d}/metrics.jsonl') if '"loss"' in l] for d in sys.argv[1:]]
print(sys.argv[1].rsplit('/', 1)[1], 'twice:', 'bitwise equal' if losses[0] == losses[1] else 'DIFFERENT', len(losses[0]), 'losses')
PY
}
read -ra variants <<< "${VARIANTS:-.variant_split}"
if [ "$what" = probe ]; then
  loop fast
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "fast_${v#.variant_}"; done
  loop deterministic --deterministic true
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "deterministic_${v#.variant_}" --deterministic true; done
  PYTHONPATH="$site:$PWD" timeout 150 python launch/save_cost_probe.py 100 20 > "$out/save_probe.txt" 2>&1
  save20 save20_shm
  peers
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "fast_${v#.variant_}_again"; done
  loop fast_again
  for kind in fast deterministic; do  # with the optimized HLO of the step, to name each kernel
    d=true; [ $kind = fast ] && d=false
    XLA_FLAGS="--xla_dump_to=$out/hlo_$kind --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*" \
      TREE=$PWD/${variants[0]} profile profile_$kind --config.deterministic=$d
    find "$out/hlo_$kind" -type f ! -name '*after_optimizations.txt' -delete 2>/dev/null
  done
  timeout 90 python launch/attention_bench.py > "$out/attention.txt" 2>&1
elif [ "$what" = deterministic ]; then
  [ -f launch/cudnn_deterministic_probe.py ] && PYTHONPATH="$site:$PWD" timeout 150 \
    python launch/cudnn_deterministic_probe.py > "$out/cudnn_probe.txt" 2>&1
  loop fast
  loop deterministic --deterministic true
  loop deterministic_again --deterministic true
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "deterministic_${v#.variant_}" --deterministic true; done
  same_losses deterministic
  echo peers > "$out/peers.txt"  # none in this plan: its ratios are to the fast loop beside them
elif [ "$what" = probe3 ]; then
  loop fast
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "fast_${v#.variant_}"; done
  flag_rows
  PYTHONPATH="$site:$PWD" timeout 150 python launch/save_cost_probe.py 100 20 > "$out/save_probe.txt" 2>&1
  for v in "${variants[@]}"; do TREE=$PWD/$v loop "fast_${v#.variant_}_again"; done
  loop fast_again
  echo peers > "$out/peers.txt"  # none in this plan: its ratios are to the fast loop beside them
elif [ "$what" = saves ]; then
  loop fast
  for again in "" _again; do
    save20 "save20_shm$again"
    for v in "${variants[@]}"; do TREE=$PWD/$v save20 "save20_shm_${v#.variant_}$again"; done
  done
  echo peers > "$out/peers.txt"  # none in this plan: its ratios are to the fast loop beside them
elif [ "$what" = check ]; then
  loop fast
  loop deterministic --deterministic true
  peers
  loop fast_again
elif [ "$what" = flags ]; then
  seed_experiment
  loop fast
  flag_rows
  loop fast_again
  echo peers > "$out/peers.txt"  # none in this plan: its ratios are to the fast loop beside them
elif [ "$what" = probe2 ]; then
  loop fast
  loop deterministic --deterministic true
  for v in "${variants[@]}"; do
    TREE=$PWD/$v loop "deterministic_${v#.variant_}" --deterministic true
    TREE=$PWD/$v loop "deterministic_${v#.variant_}_again" --deterministic true
  done
  PROBE_MODES=none,orbax,pinned_program,pinned_in_step,pinned_in_step_write PYTHONPATH="$site:$PWD" \
    timeout 150 python launch/save_cost_probe.py 100 20 > "$out/save_probe.txt" 2>&1
  peers
  loop fast_again
  loop deterministic_again --deterministic true
  for run in deterministic "${variants[@]/.variant_/deterministic_}"; do same_losses "$run"; done
elif [ "$what" = final ]; then
  loop fast
  save20 save20_shm
  for v in "${variants[@]}"; do TREE=$PWD/$v save20 "save20_shm_${v#.variant_}"; done  # e.g. before a change
  loop deterministic --deterministic true
  peers
  loop fast_again
  profile profile_fast
  seed_experiment
fi
if [ "$what" = final ] || [ "$what" = check ]; then
  if [ "${LLAMA:-1}" != 0 ]; then
    L=(--config=configs/llama3.py:llama3.2-1b --config.dtype=bfloat16 --config.batch_size=4
       --config.sequence_length=2048 --config.total_batch_size=8192 --config.scan_layers=false --steps 10)
    timeout 150 python -m jaxtrain.bench "${L[@]}" > "$out/bench_llama.txt" 2>&1
    if [ "$what" = check ]; then  # and from each variant tree, beside it
      for v in "${variants[@]}"; do
        intree "$PWD/$v" timeout 150 python -m jaxtrain.bench "${L[@]}" > "$out/bench_llama_${v#.variant_}.txt" 2>&1
      done
    fi
  fi
fi
# Everything in one file, since a device call brings back only so many.
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
cat "$out/peers.txt" "$out/figures.txt" "$out/save_probe.txt" "$out/attention.txt" "$out/cudnn_probe.txt" 2>/dev/null
tail -4 "$out/seed_deterministic.txt" 2>/dev/null
grep -h "kernels\|median\|MFU" "$out"/profile*.txt "$out"/bench*.txt 2>/dev/null | head -20
