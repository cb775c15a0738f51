#!/usr/bin/env bash
# One call on a Hopper GPU machine: install what is missing, run the GPU tests, run the benchmarks,
# print a short table last (scripts/summarize_gpu_run.py). Usage: scripts/gpu_run.sh [pytest-args...]
# Expects the nvidia-cutlass wheel in .whl/ when the machine has no nvidia-cutlass (carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mla_jit_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/cutlass_site.sh   # the carried nvidia-cutlass wheel where it is not installed
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -n "${PREWARM_ARGS:-}" ]; then  # e.g. "--preset deepseek-v3 --op flash_mla_with_kvcache"
  python3 -m mla_jit.cli prewarm --jobs "${PREWARM_JOBS:-16}" $PREWARM_ARGS 2>&1 | tail -n 2
fi
# Compile the decode kernels the tests use in parallel first (the tests then load them from disk).
if [ -z "${SKIP_DECODE_PREWARM:-}" ]; then
configs=()
for schedule in ws ws_unfused; do
  for cluster in 1 2; do
    # dtype,d,page,stages,kv: e4m3 (the FP8 tests' q and cache) runs 4 pipeline stages, bf16 / fp16
    # 3; kv e4m3: a 16-bit q over an e4m3 cache (2 stages and 2 landing slots).
    for shape in bf16,576,64,3,None bf16,576,16,3,None bf16,576,256,3,None fp16,576,64,3,None \
                 bf16,512,64,3,None e4m3,576,64,4,None e4m3,576,16,4,None e4m3,576,256,4,None \
                 e4m3,512,64,4,None bf16,576,64,2,e4m3 bf16,576,16,2,e4m3 bf16,576,256,2,e4m3 \
                 bf16,512,64,2,e4m3 fp16,576,64,2,e4m3; do
      IFS=, read -r dtype d page stages kv <<<"$shape"
      configs+=(--config "mla_decode_sm90:dtype=$dtype,head_dim=$d,page_size=$page,head_dim_v=512,block_m=64,block_n=64,num_stages=$stages,schedule=$schedule,cluster_m=$cluster,kv_dtype=$kv")
      # Compact rows (at most 32 query rows a KV head), unclustered only.
      [ "$cluster" = 1 ] && configs+=(--config "mla_decode_sm90:dtype=$dtype,head_dim=$d,page_size=$page,head_dim_v=512,block_m=64,block_n=64,num_stages=$stages,schedule=$schedule,cluster_m=1,kv_dtype=$kv,compact_rows=true")
      # e4m3's S by token halves (S_HALVES_MIN_ROWS query rows a KV head or more), either cluster size.
      [ "$dtype" = e4m3 ] && configs+=(--config "mla_decode_sm90:dtype=$dtype,head_dim=$d,page_size=$page,head_dim_v=512,block_m=64,block_n=64,num_stages=$stages,schedule=$schedule,cluster_m=$cluster,kv_dtype=$kv,s_halves=true")
    done
  done
done
python3 -m mla_jit.cli prewarm --jobs "${PREWARM_JOBS:-16}" --op flash_mla_with_kvcache "${configs[@]}" 2>&1 | tail -n 3
# The Ampere/Ada family, as the tests force it on this GPU (tuning@target); the sparse decode's kernels.
python3 -m mla_jit.cli prewarm --jobs 8 --op flash_mla_with_kvcache --arch sm_80@sm_90a --arch sm_89@sm_90a \
  2>&1 | tail -n 1
python3 -m mla_jit.cli prewarm --jobs 8 --op flash_mla_with_kvcache 2>&1 | tail -n 1
fi
# A previous commit's package for an interleaved A/B (prepared by scripts/prepare_prev.sh as
# .prev/mla_jit_prev and carried along): its kernels are built now, in parallel.
if [ -d .prev/mla_jit_prev ]; then
  export PYTHONPATH=$PWD/.prev:$PYTHONPATH
  ops=()
  [ -z "${SKIP_DECODE_BENCH:-}" ] && ops+=(--op flash_mla_with_kvcache)
  [ -z "${SKIP_PREFILL_BENCH:-}" ] && ops+=(--op flash_attn_varlen_func)
  [ -z "${SKIP_INDEXER_BENCH:-}" ] && ops+=(--op fp8_mqa_logits --op fp8_paged_mqa_logits)
  [ ${#ops[@]} -gt 0 ] && python3 -m mla_jit_prev.cli prewarm --jobs "${PREWARM_JOBS:-16}" "${ops[@]}" --arch sm_90a \
    2>&1 | tail -n 1
  BENCH_AGAINST_PACKAGE=${BENCH_AGAINST_PACKAGE:-mla_jit_prev}
fi
# Prefill (every head-dim pair the tests use) and merge kernels.
if [ -z "${SKIP_PREFILL_PREWARM:-}" ]; then
configs=()
for dims in 192,128,2 128,128,3 64,64,3; do
  IFS=, read -r d dv stages <<<"$dims"
  for dtype in bf16 fp16; do
    for causal in true false; do
      configs+=(--config "prefill_sm90:dtype=$dtype,head_dim=$d,head_dim_v=$dv,causal=$causal,num_stages=$stages")
    done
  done
done
python3 -m mla_jit.cli prewarm --jobs "${PREWARM_JOBS:-16}" --op merge_attn_states "${configs[@]}" 2>&1 | tail -n 2
python3 -m mla_jit.cli prewarm --jobs 8 --op flash_attn_varlen_func --arch sm_80@sm_90a --arch sm_89@sm_90a \
  2>&1 | tail -n 1
fi
# The indexer: the presets' kernels (H 64/32/16/8, D 128, page 64, next_n 1-4) and the others the tests use.
if [ -z "${SKIP_INDEXER_PREWARM:-}" ]; then
configs=()
for h in 8 16 32 64; do configs+=(--config "indexer_logits_sm90:heads=$h,head_dim=64"); done
for page in 32 128; do configs+=(--config "indexer_paged_sm90:heads=64,head_dim=128,next_n=2,page_size=$page,num_stages=12,math_warpgroups=3,linear_on_mma=true"); done
configs+=(--config "indexer_paged_sm90:heads=32,head_dim=64,next_n=1,page_size=64,num_stages=12,math_warpgroups=3")
python3 -m mla_jit.cli prewarm --jobs "${PREWARM_JOBS:-16}" --op fp8_mqa_logits --op fp8_paged_mqa_logits \
  --op get_paged_mqa_logits_metadata "${configs[@]}" 2>&1 | tail -n 2
fi
status=0
if [ -z "${SKIP_MAIN_TESTS:-}" ]; then
  # A protocol bug in a kernel shows up as a hang, which no in-process timeout can interrupt.
  # The whole GPU suite takes ~10 minutes serially on an H200 (session 33): more than one call allows
  # with the prewarm. TEST_WORKERS=N runs it in N pytest-xdist processes on the one GPU (the kernel
  # cache compiles each key once across processes); --durations names the slow tests.
  workers=()
  [ -n "${TEST_WORKERS:-}" ] && python3 -c "import xdist" 2>/dev/null && workers=(-n "$TEST_WORKERS")
  timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${workers[@]+"${workers[@]}"} "$@" \
    tests 2>&1 | tee "$OUT/pytest.log" | tail -n 60
  status=${PIPESTATUS[0]}
fi
if [ -n "${SANITIZE:-}" ] && command -v compute-sanitizer >/dev/null; then
  # A few cases under memcheck (decode: paged tails with NaN, zero lengths, page 16/256, d=512;
  # SANITIZE_TESTS picks another test file).
  MLA_JIT_TESTS_UNDER_MEMCHECK=1 timeout 400 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    ${SANITIZE_TESTS:-tests/test_gpu_decode.py} -k "$SANITIZE" 2>&1 | tee "$OUT/sanitizer.log" | tail -n 6
  echo "compute-sanitizer exit status: ${PIPESTATUS[0]}"
fi
if [ -z "${SKIP_JIT_BENCH:-}" ]; then
  python3 bench/bench_jit.py --json "$OUT/bench_jit.json" 2>&1 | tee "$OUT/bench_jit.log" | tail -n 12
fi
if [ -f bench/bench_decode.py ] && [ -z "${SKIP_DECODE_BENCH:-}" ]; then
  # BENCH_AGAINST=ws_unfused: that schedule timed too, interleaved call by call, with ratios;
  # BENCH_AGAINST_PACKAGE=mla_jit_prev (set above when .prev exists): the previous commit's package.
  python3 bench/bench_decode.py ${BENCH_AGAINST:+--against "$BENCH_AGAINST"} \
    ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} --json "$OUT/bench_decode.json" 2>&1 \
    | tee "$OUT/bench_decode.log" | tail -n 40
  PYTHONPATH=$PWD/bench:$PYTHONPATH python3 bench/profile_host.py 2>&1 | tee "$OUT/profile_host.log"
  if [ -n "${COMPARE_FUSED:-}" ]; then  # fused vs separate combine per shape (the "auto" rule's data)
    python3 bench/compare_fused_combine.py --json "$OUT/compare_fused_combine.json" 2>&1 | tail -n 20
  fi
  for arch in ${BENCH_ARCHS:-}; do  # e.g. BENCH_ARCHS="sm_80 sm_89": the Ampere/Ada family on this GPU
    python3 bench/bench_decode.py --arch "$arch" --json "$OUT/bench_decode_$arch.json" 2>&1 | tail -n 26
  done
fi
if [ -z "${SKIP_SPARSE_BENCH:-}" ]; then  # sparse decode against FlashMLA's H200 figures
  python3 bench/bench_sparse_decode.py ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} \
    --json "$OUT/sparse_decode.json" 2>&1 | tee "$OUT/sparse_decode.log" | tail -n 10
  for arch in ${SPARSE_BENCH_ARCHS:-}; do  # e.g. "sm_80 sm_89": the Ampere/Ada tunings on this GPU
    python3 bench/bench_sparse_decode.py --arch "$arch" --json "$OUT/sparse_decode_$arch.json" 2>&1 | tail -n 9
  done
fi
if [ -z "${SKIP_SPARSE_PREFILL_BENCH:-}" ]; then  # flash_mla_sparse_fwd against FlashMLA's H200 figures
  python3 bench/bench_sparse_prefill.py ${SPARSE_PREFILL_ARGS:-} ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} --json "$OUT/sparse_prefill.json" 2>&1 \
    | tee "$OUT/sparse_prefill.log" | tail -n 11
  for arch in ${SPARSE_BENCH_ARCHS:-}; do
    python3 bench/bench_sparse_prefill.py --arch "$arch" --quick --json "$OUT/sparse_prefill_$arch.json" 2>&1 | tail -n 5
  done
fi
if [ -f bench/bench_decode.py ] && [ -z "${SKIP_FP8_DECODE_BENCH:-}" ]; then
  # FP8 decode (e4m3 q and cache) against our bf16 decode, interleaved call by call: the anchor rows
  # and s_q 1-16 (bench_decode.py --fp8; summarized from fp8_decode.json).
  # FP8_AGAINST_ENV=NAME=VALUE (e.g. MLA_JIT_SM90_CLUSTER=1): that kernel as the contender
  # instead of the previous package's.
  if [ -n "${FP8_AGAINST_ENV:-}" ]; then fp8_against=(--against-env "$FP8_AGAINST_ENV")
  else fp8_against=(${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"}); fi
  python3 bench/bench_decode.py --fp8 ${fp8_against[@]+"${fp8_against[@]}"} \
    --json "$OUT/fp8_decode.json" 2>&1 | tee "$OUT/fp8_decode.log" | tail -n 40
fi
for arch in ${FP8_BENCH_ARCHS:-}; do  # e.g. "sm_80 sm_89": the mma.sync family over the FP8 cache on this GPU
  python3 bench/bench_decode.py --fp8 --arch "$arch" ${FP8_BENCH_ARGS:-} --json "$OUT/fp8_decode_$arch.json" 2>&1 \
    | tee "$OUT/fp8_decode_$arch.log" | tail -n 5
done
if [ -z "${SKIP_PREFILL_BENCH:-}" ]; then
  python3 bench/bench_prefill.py ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} \
    --json "$OUT/bench_prefill.json" 2>&1 | tee "$OUT/bench_prefill.log" | tail -n 12
  for arch in ${PREFILL_BENCH_ARCHS:-}; do  # e.g. "sm_80 sm_89": the mma.sync family on this GPU
    python3 bench/bench_prefill.py --arch "$arch" ${PREFILL_BENCH_ARGS:+$PREFILL_BENCH_ARGS} \
      --json "$OUT/bench_prefill_$arch.json" 2>&1 \
      | tee "$OUT/bench_prefill_$arch.log" | tail -n 10
  done
fi
if [ -z "${SKIP_INDEXER_BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-400}" python3 bench/bench_indexer.py ${INDEXER_BENCH_ARGS:-} \
    ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} --json "$OUT/bench_indexer.json" 2>&1 \
    | tee "$OUT/bench_indexer.log" | tail -n 32
  for arch in ${INDEXER_BENCH_ARCHS:-}; do  # e.g. "sm_80 sm_89": the mma.sync kernels on this GPU
    timeout "${BENCH_TIMEOUT:-400}" python3 bench/bench_indexer.py --arch "$arch" ${INDEXER_BENCH_ARGS:-} \
      ${BENCH_AGAINST_PACKAGE:+--against-package "$BENCH_AGAINST_PACKAGE"} --json "$OUT/bench_indexer_$arch.json" 2>&1 | tee "$OUT/bench_indexer_$arch.log" | tail -n 32
  done
fi
if [ -n "${SPEC_BENCH:-}" ]; then  # decode with 1-16 query tokens a sequence (speculative decoding)
  python3 bench/bench_decode.py --spec-rows --json "$OUT/spec_decode.json" 2>&1 | tail -n 18
fi
for case in ${TRACE_CASES:-}; do  # e.g. TRACE_CASES="32,1,4096,16 128,1,4096,16": per-CTA timelines
  PYTHONPATH=$PWD/bench:$PYTHONPATH python3 bench/trace_decode.py ${case//,/ } ${TRACE_ARGS:-} \
    --rows-out "$OUT/trace_${case//,/_}.csv" 2>&1 | tail -n 20
done
# e.g. WS_PHASE_CASES="fp8,128,1,4096,128 sparse,128,1,64": where a tile's time goes in the warp-specialized
# kernel (bench/trace_ws_phases.py); WS_PHASE_ENV="NAME=VALUE" traces that variant too.
for case in ${WS_PHASE_CASES:-}; do
  for variant in "" ${WS_PHASE_ENV:-}; do
    [ -n "$variant" ] && echo "== $variant"
    timeout 90 env $variant PYTHONPATH=$PWD/bench:$PYTHONPATH python3 bench/trace_ws_phases.py ${case//,/ } 2>&1 | tail -n 2
  done
done
if [ -z "${SKIP_TP_STARTUP_BENCH:-}" ]; then  # tensor-parallel ranks starting from a warm shared root
  timeout "${BENCH_TIMEOUT:-400}" python3 bench/bench_tp_startup.py --ranks "${TP_RANKS:-8}" \
    --json "$OUT/tp_startup.json" 2>&1 | tee "$OUT/tp_startup.log" | tail -n 10
fi
echo "pytest exit status: $status"
python3 scripts/summarize_gpu_run.py "$OUT"
exit $status
