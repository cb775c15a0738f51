"""One module per kernel family; importing this package registers them all."""
from . import decode, toy  # noqa: F401
