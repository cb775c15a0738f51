#!/usr/bin/env bash
# Extract a commit's mla_jit package as .prev/mla_jit_prev (git-ignored), so that scripts/gpu_run.sh
# times it interleaved with the working tree (carry ".prev" to the GPU machine).
# Usage: scripts/prepare_prev.sh [COMMIT]   (default: HEAD)
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:-HEAD}
rm -rf .prev && mkdir -p .prev/tmp
git archive "$commit" mla_jit | tar -x -C .prev/tmp
mv .prev/tmp/mla_jit .prev/mla_jit_prev && rmdir .prev/tmp
if grep -rqE "^(from|import) mla_jit" .prev/mla_jit_prev; then
  echo "warning: $commit's package imports itself by absolute name; the copy may load the working tree" >&2
fi
echo "prepared .prev/mla_jit_prev from $(git rev-parse --short "$commit")"
