"""One module per kernel family; importing this package registers them all."""
from . import decode, merge, prefill, toy  # noqa: F401
