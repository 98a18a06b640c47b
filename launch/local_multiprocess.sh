#!/usr/bin/env bash
# Several processes on this machine, joined by jax.distributed exactly as on many hosts:
# on CPU each process gets fake devices (tests of the many-host code paths), on GPU each
# process gets one GPU. Process 0 prints to the terminal; the others log to LOG_DIR.
#
# usage: launch/local_multiprocess.sh NUM_PROCESSES CONFIG [trainer flags...]
#   e.g. launch/local_multiprocess.sh 2 configs/gpt2.py:tiny --mesh_fsdp 4 --num_iteration 20 \
#          --checkpoint_dir /tmp/ck --save_steps 10
# env:   PLATFORM            cpu (default) or gpu
#        DEVICES_PER_PROCESS fake CPU devices per process (default 4; cpu only)
#        PORT                coordinator port on localhost (default: a free one)
#        LOG_DIR             where processes 1.. write process_<id>.log (default: a temporary directory)
#        PYTHON              the interpreter with jaxtrain installed (default: python)
set -uo pipefail
if [ $# -lt 2 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
  sed -n '2,13p' "$0"; exit 2
fi
count=$1; config=$2; shift 2
python=${PYTHON:-python}
platform=${PLATFORM:-cpu}
port=${PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
log_dir=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$log_dir"

pids=()
for ((i = 0; i < count; i++)); do
  if [ "$platform" = cpu ]; then
    env=(JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=${DEVICES_PER_PROCESS:-4}")
  else
    env=(CUDA_VISIBLE_DEVICES="$i")
  fi
  command=(env "${env[@]}" "$python" -m jaxtrain.main --config="$config" "$@"
           --coordinator_address "localhost:$port" --num_processes "$count" --process_id "$i")
  if [ "$i" -eq 0 ]; then "${command[@]}" & else "${command[@]}" > "$log_dir/process_$i.log" 2>&1 & fi
  pids+=($!)
done
# Ctrl-C or SIGTERM goes to every process: they stop together after the current step and save.
trap 'kill -TERM "${pids[@]}" 2>/dev/null' INT TERM
status=0
for pid in "${pids[@]}"; do
  wait "$pid"; code=$?
  while [ "$code" -gt 128 ] && kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done  # a trapped signal
  [ "$code" -ne 0 ] && [ "$status" -eq 0 ] && status=$code
done
[ "$count" -gt 1 ] && echo "logs of processes 1..$((count - 1)): $log_dir" >&2
exit "$status"
