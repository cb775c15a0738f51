"""One module per kernel family; importing this package registers them all."""
from . import toy  # noqa: F401
