"""`mla-jit`: prewarm | list | clear | info (the parser and main; one module per command group).

Startup stays light: the CLI never imports torch (only `info` does, for its GPU section) and never
touches CUDA. `prewarm` renders every kernel and looks it up in the cache in this process, and
starts compile processes only for the misses, so a warm prewarm takes well under a second.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

from .cache_cmds import cmd_clear, cmd_info, cmd_list
from .catalog import arch_names, catalog, default_ops, example_ops, ops, preset_names
from .prewarm import cmd_prewarm


def build_parser() -> argparse.ArgumentParser:
    epilog = catalog()
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="mla-jit", description="mla_jit kernel cache and JIT tools",
                                     epilog=epilog, formatter_class=raw)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prewarm", help="compile the kernels of the registered ops into the cache (no GPU needed)",
                       description=textwrap.fill(
                           "Compile kernels into the writable cache root (MLA_JIT_CACHE_DIR), whatever "
                           "MLA_JIT_OFFLINE says (it governs ops only). Fails, before compiling anything, "
                           "if that directory is unusable.", 100),
                       epilog=epilog, formatter_class=raw)
    p.add_argument("--arch", action="append",
                   help=f"target arch: {', '.join(arch_names())}; TUNING@TARGET (e.g. sm_80@sm_90a) builds a "
                   "family for a newer GPU. Repeatable. Default: MLA_JIT_ARCH or sm_90a")
    p.add_argument("--preset", action="append",
                   help=f"model preset: {', '.join(preset_names())}. Repeatable. Default: all")
    p.add_argument("--op", action="append",
                   help=f"only kernels of this op: {', '.join(ops())}. Repeatable. Default: "
                   f"{', '.join(default_ops())} (the examples {', '.join(example_ops())} only when named)")
    p.add_argument("--config", action="append", help="one exact kernel, FAMILY:field=value,... "
                   "(as printed by offline-mode errors). Repeatable")
    p.add_argument("--jobs", type=int, default=0, help="parallel compile processes (default: CPU count)")
    p.add_argument("--compiler", choices=("nvrtc", "nvcc"), help="default: MLA_JIT_COMPILER or nvrtc")
    p.set_defaults(func=cmd_prewarm)
    p = sub.add_parser("list", help="list cached kernels")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("clear", help="remove every kernel from the writable cache root")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_clear)
    p = sub.add_parser("info", help="versions, GPU, cache roots and effective environment")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)
    return parser


def _quiet_broken_stdout() -> None:
    """stdout's reader went away (`mla-jit list | head -1`): send the rest to /dev/null so the final
    flush at exit does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    import logging
    from ..errors import MlaJitError
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")
    try:
        from ..log import configure_from_env
        configure_from_env()
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()
        return code
    except MlaJitError as exc:
        print(f"mla-jit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mla-jit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_broken_stdout()
        return 141   # 128 + SIGPIPE, what a Unix tool killed by the broken pipe reports


if __name__ == "__main__":
    sys.exit(main())
