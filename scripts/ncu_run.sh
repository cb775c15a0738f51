#!/usr/bin/env bash
# Hardware counters of the split-KV kernels for a few decode shapes (needs ncu on the GPU machine).
# Usage: scripts/ncu_run.sh "B S_Q S_K H_Q [--arch A] [--schedule S]" ...   (one quoted case per arg)
# Prefill: NCU_SCRIPT=bench/profile_prefill.py NCU_KERNEL=prefill scripts/ncu_run.sh "B S H [--arch A]"
# Indexer: NCU_SCRIPT=bench/profile_indexer.py NCU_KERNEL=indexer_logits scripts/ncu_run.sh "SEQ KV"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mla_jit_out}
mkdir -p "$OUT"
. scripts/cutlass_site.sh   # the carried nvidia-cutlass wheel where it is not installed
export PYTHONPATH=$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}
metrics=sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_sector_hit_rate.pct
metrics+=,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio
n=0
for case in "$@"; do
  n=$((n + 1))
  script=${NCU_SCRIPT:-bench/profile_kernels.py}
  python3 "$script" $case >/dev/null 2>&1  # compile + warm the cache outside ncu
  echo "=== case $n: $case"
  # NCU_SOURCE=1: also the per-instruction stall samples (SourceCounters), as CSV in $OUT/src_N.csv.
  timeout 300 ncu --clock-control none -k "regex:${NCU_KERNEL:-splitkv}" --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats ${NCU_SOURCE:+--section SourceCounters} \
    --metrics "$metrics" -f -o "$OUT/ncu_$n" python3 "$script" $case >/dev/null 2>&1
  ncu -i "$OUT/ncu_$n.ncu-rep" --page details 2>&1 | tee "$OUT/ncu_$n.txt" \
    | grep -E "pct|sum|hit_rate|stalled|Warp Cycles|Issued Warp|No Eligible|Eligible" | grep -vE " 0(\.0+)?$" | head -45
  [ -n "${NCU_SOURCE:-}" ] && ncu -i "$OUT/ncu_$n.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/src_$n.csv" 2>&1
done
