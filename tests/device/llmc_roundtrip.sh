#!/bin/bash
# On a GPU machine: build llm.c's train_gpt2cu (karpathy/llm.c f1e2ace6, no cuDNN, no MPI) and run
# tests/device/test_llmc_export_resume.py, which has it resume a run folder our `ckpt export
# --format llmc-run` wrote. Usage (from the repository root):
#   LLMC_SRC=path/to/llm.c [LLMC_EXPORT_DIR=DIR] [OUT=DIR] bash tests/device/llmc_roundtrip.sh
# LLMC_EXPORT_DIR: our half made beforehand (python tests/device/test_llmc_export_resume.py prepare DIR)
# for a machine without jaxtrain's dependencies. OUT gets build.log, llm.c's log and the figures.
set -u -o pipefail
OUT=${OUT:-/tmp/llmc_roundtrip}
SRC=${LLMC_SRC:?set LLMC_SRC to a checkout of karpathy/llm.c}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/llmc_build.XXXXXX)
cp -r "$SRC" "$W/src"
export LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib64/stubs:${LIBRARY_PATH:-}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# GPU_COMPUTE_CAPABILITY must be given: the Makefile's $(nvidia-smi ...) default is an empty Make variable.
CC_CAP=${GPU_COMPUTE_CAPABILITY:-90}
(cd "$W/src" && make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=$CC_CAP) \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
LLMC_BIN="$W/src/train_gpt2cu" LLMC_ROUNDTRIP_OUT="$OUT" JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} \
    python3 -m pytest -q -p no:cacheprovider -s tests/device/test_llmc_export_resume.py 2>&1 | tee "$OUT/pytest.log"
