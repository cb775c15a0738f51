"""The instruction mix of a kernel config's loops, from its SASS: no GPU needed.

Builds FAMILY:field=value,... (the CLI's --config spec) for an arch, disassembles the cubin with
cuobjdump and prints, for every backward branch whose body holds MMAs, the loop's address range,
its instruction count and its most frequent opcodes. Compare two configs or two trees by the main
loop's counts (session 28 found +117 IMAD and +36 MOV a tile this way: ldmatrix addresses added at
every use, and B operands not in register pairs).

Usage: python bench/sass_loops.py SPEC [SPEC ...] [--arch sm_90a] [--target sm_90a] [--top 14]
       (--target: compile for another arch than the tuning's, as MLA_JIT_ARCH=sm_80 on an H200 does)
Needs cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

from mla_jit.jit.arch import ArchPair, parse_arch, resolve_for_build
from mla_jit.jit.build import build
from mla_jit.runtimes import registry

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")
_BRANCH = re.compile(r"BRA(?:\.\w+)*\s+0x([0-9a-f]+)")
_MMA = ("HMMA", "HGMMA", "QGMMA", "IGMMA", "IMMA", "QMMA")   # mma.sync and wgmma opcodes


def sass_of(cubin: bytes) -> str:
    from cuda import pathfinder
    tool = pathfinder.find_nvidia_binary_utility("cuobjdump")
    disasm = pathfinder.find_nvidia_binary_utility("nvdisasm")
    if not tool or not disasm:
        raise SystemExit("cuobjdump / nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    env = {**os.environ, "PATH": f"{os.path.dirname(disasm)}{os.pathsep}{os.environ.get('PATH', '')}"}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True,
                              env=env).stdout


def loops(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, opcode counts) of each backward branch's body that holds an MMA (spans through an
    EXIT are the out-of-line stubs after the function's end jumping back, not loops)."""
    code = [(int(m.group(1), 16), m.group(2).split(".")[0], line)
            for line in sass.splitlines() if (m := _LINE.match(line))]
    found = []
    for addr, _, line in code:
        branch = _BRANCH.search(line)
        if branch and int(branch.group(1), 16) < addr:
            start = int(branch.group(1), 16)
            ops = collections.Counter(op for a, op, _ in code if start <= a <= addr)
            if any(ops[m] for m in _MMA) and not ops["EXIT"]:
                found.append((start, addr, ops))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", help="FAMILY:field=value,... (as prewarm --config)")
    ap.add_argument("--arch", default="sm_90a", help="tuning arch (default sm_90a)")
    ap.add_argument("--target", help="target arch when it differs from the tuning's")
    ap.add_argument("--top", type=int, default=14, help="opcodes shown a loop")
    args = ap.parse_args()
    pair = (ArchPair(parse_arch(args.arch), parse_arch(args.target)) if args.target
            else resolve_for_build(args.arch))
    for spec in args.specs:
        family = registry.get(spec.partition(":")[0])
        if pair.tuning.name not in family.tunings:
            raise SystemExit(f"{family.name} has tunings {', '.join(family.tunings)}, not {pair.tuning.name} (--arch)")
        binary = build(family.source(family.config_from_spec(spec), pair))
        print(f"{spec} ({pair.tuning.name} -> {pair.target.name})")
        for start, end, ops in loops(sass_of(binary.cubin)):
            mix = ", ".join(f"{op} {n}" for op, n in ops.most_common(args.top))
            print(f"  loop {start:#x}-{end:#x}: {sum(ops.values())} instructions: {mix}")


if __name__ == "__main__":
    main()
