#!/usr/bin/env bash
# The sparse (DSA) kernels in one call on a Hopper GPU: their GPU tests on the working tree, memcheck
# on a few cases, then the decode and prefill benchmarks interleaved call by call against each package
# copy named (prepared under .prev/ by scripts/prepare_prev.sh; carry .prev and .whl).
# Usage: scripts/ab_sparse.sh PKG...   (ratio in the tables: PKG's time / ours)
# SKIP_SPARSE_TESTS=1 skips the tests; SANITIZE_K="pytest -k expression" picks the memcheck cases
# (tests/test_gpu_sparse_decode.py), none by default; PREFILL_QUICK=1 runs the s_kv 32768 prefill rows only;
# TRACE_CASES="128,1,128 ..." traces the working tree's tiles after (bench/trace_ws_phases.py sparse B S_Q H_Q).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
. scripts/cutlass_site.sh   # the carried nvidia-cutlass wheel where it is not installed
export PYTHONPATH=$PWD:$PWD/.prev${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ -z "${SKIP_SPARSE_TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -n 8 -m gpu tests/test_gpu_sparse_decode.py tests/test_gpu_sparse_prefill.py \
    2>&1 | tail -n 5
fi
if [ -n "${SANITIZE_K:-}" ]; then
  MLA_JIT_TESTS_UNDER_MEMCHECK=1 timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu_sparse_decode.py -k "$SANITIZE_K" 2>&1 | tail -n 4
  echo "memcheck rc ${PIPESTATUS[0]}"
fi
for pkg in "$@"; do
  echo "== sparse decode, ours against $pkg (ratio: $pkg's time / ours)"
  timeout 200 python3 bench/bench_sparse_decode.py --against-package "$pkg" 2>&1 | tail -n 16
  echo "== sparse prefill, ours against $pkg"
  timeout 200 python3 bench/bench_sparse_prefill.py ${PREFILL_QUICK:+--quick} --against-package "$pkg" 2>&1 | tail -n 16
done
for case in ${TRACE_CASES:-}; do
  timeout 120 env PYTHONPATH=$PWD/bench:$PYTHONPATH python3 bench/trace_ws_phases.py sparse ${case//,/ } 2>&1 | tail -n 2
done
