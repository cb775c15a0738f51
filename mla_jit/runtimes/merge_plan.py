"""Launch plans of the attention-state merge: the config for a layout and its launches by grid size."""
from __future__ import annotations

import torch

from ..configs.merge import merge_config, merge_grid
from ..dtypes import name_of
from ..jit import env
from ..jit.arch import resolve_for_device
from ..jit.launch import Blob
from . import registry
from .merge import MERGE_PARAMS

MAX_PLANS = 1024
plans: dict[tuple, "MergePlan"] = {}   # layout signature (no token count) -> plan, filled by the op
# The variable that picks a kernel: part of the plan key (read raw on the warm path).
plan_env = env.raw_reader("MLA_JIT_ARCH")


class MergePlan:
    """What a layout needs beyond its token count: the config and the launches by grid size."""

    __slots__ = ("cfg", "arch", "device_index", "vec", "num_heads", "launches")

    def __init__(self, output: torch.Tensor):
        self.device_index = output.get_device()
        self.arch = resolve_for_device(self.device_index)
        self.cfg = merge_config(name_of(output.dtype), output.shape[2], self.arch.tuning)
        self.vec = 16 // output.element_size()
        self.num_heads = output.shape[1]
        self.launches: dict[int, object] = {}

    def launch(self, num_tokens: int):
        grid = merge_grid(num_tokens * self.num_heads, self.cfg.rows_per_cta)
        launch = self.launches.get(grid)
        if launch is None:
            family = registry.get("merge_states")
            launch = self.launches[grid] = family.launcher(self.cfg, self.arch, family.ENTRY, self.device_index,
                                                           (Blob(MERGE_PARAMS.size),), (grid, 1, 1),
                                                           (self.cfg.num_threads, 1, 1))
        return launch
