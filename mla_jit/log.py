"""The 'mla_jit' logger; its level follows MLA_JIT_LOG_LEVEL (applied lazily, never at import)."""
from __future__ import annotations

import logging

logger = logging.getLogger("mla_jit")
_configured_level: str | None = None


def configure_from_env() -> None:
    """Apply MLA_JIT_LOG_LEVEL (DEBUG forced by MLA_JIT_DEBUG). Cheap when nothing changed."""
    global _configured_level
    from .jit import env
    level = "DEBUG" if env.debug() else env.log_level()
    if level == _configured_level:
        return
    _configured_level = level
    logger.setLevel(getattr(logging, level, logging.WARNING))
