#!/usr/bin/env bash
# One GPU call for candidate patches (bench/patches/*.patch): each patch's GPU tests with the patch
# applied to this tree (reverted after), then the interleaved benchmarks of the patched package copies
# against the tree. Prepare the copies first (scripts/prepare_prev.sh HEAD NAME PATCH) and carry
# ".prev" and ".whl".
# Usage: scripts/try_patches.sh PATCH=TESTS[,TESTS...] ...
#   e.g. scripts/try_patches.sh bench/patches/X.patch=tests/test_gpu_decode_fp8.py
# Environment: FP8_PKGS="mla_jit_x ..." (scripts/ab_fp8_decode.sh 4 against them), SPARSE_PKGS="..."
# (bench_sparse_decode.py --arch sm_80 and sm_89 against each), TEST_WORKERS (default 8).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
. scripts/cutlass_site.sh   # the carried nvidia-cutlass wheel where it is not installed
export PYTHONPATH=$PWD:$PWD/.prev${PYTHONPATH:+:$PYTHONPATH}
# patch(1), or git apply where the machine lacks it (both work outside a git checkout).
apply_patch() {  # apply_patch FILE [-R]
  if command -v patch >/dev/null; then patch -p1 --forward --quiet ${2:+-R} < "$1"; else git apply ${2:+-R} "$1"; fi
}
status=0
for spec in "$@"; do
  patch_file=${spec%%=*}
  tests=${spec#*=}
  echo "== tests with $patch_file applied: ${tests//,/ }"
  if ! apply_patch "$patch_file"; then
    echo "$patch_file does not apply to this tree"; status=1; continue
  fi
  python3 -m pytest -q -x -n "${TEST_WORKERS:-8}" -m gpu ${tests//,/ } 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  apply_patch "$patch_file" -R || { echo "$patch_file did not revert"; exit 1; }
done
if [ -n "${FP8_PKGS:-}" ]; then
  # shellcheck disable=SC2086
  SKIP_FP8_TESTS=1 scripts/ab_fp8_decode.sh 4 $FP8_PKGS
fi
for pkg in ${SPARSE_PKGS:-}; do
  for arch in sm_80 sm_89; do
    echo "== sparse decode, $arch tuning forced: ours against $pkg"
    python3 bench/bench_sparse_decode.py --arch "$arch" --against-package "$pkg" 2>&1 | tail -n 14
  done
done
exit $status
