"""Where the host time of a warm decode call goes (each piece timed alone, median of rounds)."""

import torch

import mla_jit
from mla_jit.ops import decode as dec
from mla_jit.runtimes import decode_plan as runtime
from mla_jit.runtimes import workspace
from mla_jit.runtimes.decode import DECODE_PARAMS

from bench_decode import make_inputs
from timing import host_time_us


def per_call_us(fn):
    return host_time_us(fn, calls=200, rounds=15)


q, k_cache, block_table, lens = make_inputs(1, 1, 256, 16)
meta, splits = mla_jit.get_mla_metadata(lens, 16, 1)
args = (q, k_cache, block_table, lens, 512, meta, splits)
mla_jit.flash_mla_with_kvcache(*args)
sig = dec._signature(*args)
plan = runtime.decode_plans[sig]
dev = q.device
stream = runtime.current_stream(0)
kv_key = (k_cache.data_ptr(), k_cache.shape, k_cache.dtype)
kv_desc = runtime.kv_descriptor(k_cache, kv_key, plan.box)
# Launch params of a real call (pointers into live tensors: the timed launches do real work).
out = torch.empty((1, 1, 16, 512), dtype=torch.bfloat16, device=dev)
lse = torch.empty((1, 16, 1), dtype=torch.float32, device=dev)
scratch, counters, _ = workspace.decode_scratch(0, stream, plan.accum_elems, plan.counter_elems, q)
params = DECODE_PARAMS.pack(q.data_ptr(), out.data_ptr(), lse.data_ptr(), scratch, scratch + 4 * plan.o_accum_elems,
                            block_table.data_ptr(), lens.data_ptr(), meta.data_ptr(), splits.data_ptr(),
                            *q.stride()[:3], plan.bt_stride, 1, 1, 16, plan.h_kv, plan.q_per_kv, plan.rows,
                            plan.parts, plan.max_blocks, plan.default_scale, plan.default_scale * 1.4426950408889634, 0,
                            1, counters, 0, 0, 0, 0, 0, 0, 0, 0)  # no descales, no sparse fields: a bf16 call
sched, _ = mla_jit.get_mla_metadata()
mla_jit.flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, sched, None)
rows = {
    "whole decode call": lambda: mla_jit.flash_mla_with_kvcache(*args),
    "whole decode call, filled FlashMLASchedMeta": lambda: mla_jit.flash_mla_with_kvcache(
        q, k_cache, block_table, lens, 512, sched, None),
    "torch.ops.mla_jit decode": lambda: torch.ops.mla_jit.flash_mla_with_kvcache(*args),
    "whole metadata call": lambda: mla_jit.get_mla_metadata(lens, 16, 1),
    "signature tuple": lambda: dec._signature(*args),
    "signature + dict get": lambda: runtime.decode_plans.get(dec._signature(*args)),
    "plan.run (outputs, scratch, pack, launch)": lambda: plan.run(q, q.data_ptr(), k_cache, k_cache.data_ptr(),
                                                                  block_table, lens, meta, splits,
                                                                  plan.default_scale, False),
    "q.new_empty x1": lambda: q.new_empty((1, 1, 16, 512)),
    "scratch lookup": lambda: workspace.decode_scratch(0, runtime.current_stream(0), plan.accum_elems,
                                                       plan.counter_elems, q),
    "env plan inputs": lambda: runtime.plan_env(),
    "torch.compiler.is_compiling": lambda: torch.compiler.is_compiling(),
    "splitkv launch": lambda: plan.splitkv(stream, params, kv_desc),
    "data_ptr x1": lambda: q.data_ptr(),
    "struct pack": lambda: DECODE_PARAMS.pack(*([1] * 9), 1, 1, 1, 1, *([1] * 8), 1.0, 1.0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                              1, 1),
    "current_stream": lambda: runtime.current_stream(0),
    "kv descriptor lookup": lambda: runtime.kv_descriptor(k_cache, (k_cache.data_ptr(), k_cache.shape,
                                                                    k_cache.dtype), plan.box),
}
if plan.combine is not None:  # the unfused schedule
    rows["combine launch"] = lambda: plan.combine(stream, params)
for name, fn in rows.items():
    print(f"{name:44} {per_call_us(fn):7.2f} us")
