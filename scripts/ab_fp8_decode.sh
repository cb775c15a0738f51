#!/usr/bin/env bash
# A quick interleaved A/B of the FP8 decode (e4m3 q and cache) on a Hopper GPU: the working tree's
# kernels against each package copy named (prepared under .prev/, e.g. by scripts/prepare_prev.sh and
# an edit; carry .prev and .whl), after the FP8 GPU tests on the working tree.
# Usage: scripts/ab_fp8_decode.sh ROWS PKG...   (ROWS: bench_decode.py --fp8 --rows, the anchor rows;
# the s_q 1-16 rows always run)
# SKIP_FP8_TESTS=1 skips the tests; WS_PHASE_CASES as in gpu_run.sh traces the working tree after.
set -uo pipefail
cd "$(dirname "$0")/.."
rows=$1; shift
export PYTHONUNBUFFERED=1
. scripts/cutlass_site.sh   # the carried nvidia-cutlass wheel where it is not installed
export PYTHONPATH=$PWD:$PWD/.prev${PYTHONPATH:+:$PYTHONPATH}
# The bench's and the FP8 tests' kernels, every package in parallel.
common="head_dim_v=512,block_m=64,block_n=64,page_size=64"
configs=()
for schedule in ws ws_unfused; do
  for cluster in 1 2; do
    configs+=(--config "mla_decode_sm90:dtype=e4m3,head_dim=576,$common,num_stages=4,schedule=$schedule,cluster_m=$cluster,kv_dtype=None")
  done
  configs+=(--config "mla_decode_sm90:dtype=e4m3,head_dim=576,$common,num_stages=4,schedule=$schedule,cluster_m=1,kv_dtype=None,compact_rows=true")
done
ours=("${configs[@]}")
for cluster in 1 2; do
  for kv in "num_stages=3,kv_dtype=None" "num_stages=2,kv_dtype=e4m3"; do
    ours+=(--config "mla_decode_sm90:dtype=bf16,head_dim=576,$common,$kv,schedule=ws,cluster_m=$cluster")
  done
done
python3 -m mla_jit.cli prewarm --jobs 16 --op flash_mla_with_kvcache "${ours[@]}" 2>&1 | tail -n 1 &
for pkg in "$@"; do
  python3 -m "$pkg.cli" prewarm --jobs 8 "${configs[@]}" 2>&1 | tail -n 1 &
done
wait
if [ -z "${SKIP_FP8_TESTS:-}" ]; then
  python3 -m pytest -q -x -n 8 -m gpu tests/test_gpu_decode_fp8.py 2>&1 | tail -n 3
fi
for pkg in "$@"; do
  echo "== ours against $pkg (ratio: $pkg's time / ours)"
  python3 bench/bench_decode.py --fp8 --rows "$rows" --against-package "$pkg" 2>&1 | tail -n 40
done
for case in ${WS_PHASE_CASES:-}; do
  timeout 90 env PYTHONPATH=$PWD/bench:$PYTHONPATH python3 bench/trace_ws_phases.py ${case//,/ } 2>&1 | tail -n 2
done
