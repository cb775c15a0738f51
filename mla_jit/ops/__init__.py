"""One module per op: validate inputs, pick a config, call the family's runtime."""
