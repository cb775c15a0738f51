"""One module per kernel family; importing this package registers them all."""
from . import decode, merge, toy  # noqa: F401
