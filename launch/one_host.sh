#!/usr/bin/env bash
# One host, one process, every local device: plain data parallelism needs nothing beyond
# the device count (the mesh defaults to data = all devices; add --mesh_fsdp 8 for FSDP).
#
# usage: launch/one_host.sh CONFIG [trainer flags...]
#   e.g. launch/one_host.sh configs/gpt2.py:d12 --input_bin 'fineweb_train_*.bin' \
#          --batch_size 16 --sequence_length 1024 --total_batch_size 524288 --checkpoint_dir ck --save_steps 500
# env:   GPUS   which GPUs to use, e.g. 0,1 (default: all; sets CUDA_VISIBLE_DEVICES)
#        PYTHON the interpreter with jaxtrain installed (default: python)
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
  sed -n '2,9p' "$0"; exit 2
fi
config=$1; shift
if [ -n "${GPUS:-}" ]; then export CUDA_VISIBLE_DEVICES=$GPUS; fi
exec "${PYTHON:-python}" -m jaxtrain.main --config="$config" "$@"
