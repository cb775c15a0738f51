"""The on-disk kernel cache: content keys, atomic publish, per-key locks, integrity checks."""
