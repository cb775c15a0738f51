#!/usr/bin/env bash
# Extract a commit's mla_jit package as .prev/NAME (git-ignored; default mla_jit_prev), optionally with
# patches applied (paths as `git diff` writes them, a/mla_jit/...), so that the benchmarks time it
# interleaved with the working tree (--against-package NAME; carry ".prev" to the GPU machine). Other
# copies under .prev are kept.
# Usage: scripts/prepare_prev.sh [COMMIT [NAME [PATCH...]]]   (default: HEAD mla_jit_prev)
#   e.g. scripts/prepare_prev.sh HEAD mla_jit_x bench/patches/X.patch
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:-HEAD}
name=${2:-mla_jit_prev}
shift $(( $# < 2 ? $# : 2 ))
case "$name" in
  mla_jit_*) ;;
  *) echo "NAME must start with mla_jit_ (got '$name')" >&2; exit 2 ;;
esac
tmp=.prev/.tmp_$name
rm -rf ".prev/$name" "$tmp" && mkdir -p "$tmp"
git archive "$commit" mla_jit | tar -x -C "$tmp"
# Only the patches' files under mla_jit/ (a patch may also carry its tests).
package_part() {
  python3 -c 'import re, sys; print("".join(b for b in re.split(r"(?m)^(?=diff --git )", open(sys.argv[1]).read()) if not b.startswith("diff --git ") or b.startswith("diff --git a/mla_jit/")), end="")' "$1"
}
for patch_file in "$@"; do
  package_part "$patch_file" | patch --quiet --forward -d "$tmp/mla_jit" -p2 || { echo "$patch_file does not apply" >&2; exit 1; }
done
mv "$tmp/mla_jit" ".prev/$name" && rmdir "$tmp"
if grep -rqE "^(from|import) mla_jit" ".prev/$name"; then
  echo "warning: $commit's package imports itself by absolute name; the copy may load the working tree" >&2
fi
echo "prepared .prev/$name from $(git rev-parse --short "$commit")${*:+ with $*}"
