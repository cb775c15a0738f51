"""Pure (shape, arch) -> frozen config functions. No GPU, no I/O: testable anywhere."""
