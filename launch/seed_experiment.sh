#!/usr/bin/env bash
# The seed's acceptance experiment on this host: train N steps saving every S, resume a
# second run from step R, and demand identical losses after R and identical final weights.
#
# usage: launch/seed_experiment.sh OUT_DIR CONFIG [trainer flags...]
#   e.g. launch/seed_experiment.sh /tmp/seed configs/gpt2.py:d12 --dtype bfloat16 --input_bin TRAIN.bin
# env:   STEPS (100), SAVE (20), RESUME (40), THRESHOLD (0 = bitwise)
set -euo pipefail
if [ $# -lt 2 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
  sed -n '2,8p' "$0"; exit 2
fi
out=$1; config=$2; shift 2
steps=${STEPS:-100}; save=${SAVE:-20}; resume=${RESUME:-40}; threshold=${THRESHOLD:-0}
mkdir -p "$out/base" "$out/test"
name=$(basename "${config%%:*}" .py)
# InfiniTrain's compare_loss.py picks the bf16 threshold by a `_bfloat16` in the log name.
[[ " $* " == *" bfloat16 "* || " $* " == *"=bfloat16 "* ]] && name="${name}_bfloat16"
common=(--num_iteration "$steps" --save_steps "$save" --save_optimizer_state true --max_checkpoint_keep 10 "$@")

python -m jaxtrain.main --config="$config" "${common[@]}" --checkpoint_dir "$out/ck/noresume" \
  > "$out/base/$name.log" 2>&1
python -m jaxtrain.main --config="$config" "${common[@]}" --checkpoint_dir "$out/ck/resumefrom$resume" \
  --resume_from "$out/ck/noresume/$(printf 'checkpoint_step_%06d' "$resume")" > "$out/test/$name.log" 2>&1

python -m jaxtrain.compare_loss "$out/base" "$out/test" --threshold-fp32 "$threshold" --threshold-bf16 "$threshold"
last=$(printf 'checkpoint_step_%06d' "$steps")
python -m jaxtrain.ckpt diff "$out/ck/noresume/$last" "$out/ck/resumefrom$resume/$last"
