"""The JIT core: env, arch, render, compile, load, TMA, launch. Knows nothing of kernel families."""
