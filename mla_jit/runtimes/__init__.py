"""One module per kernel family; importing this package registers them all."""
from . import decode, indexer, merge, prefill, toy  # noqa: F401
