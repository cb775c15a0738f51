# Sourced by the GPU scripts from the repository root: where nvidia-cutlass is not installed (the GPU
# machine's image), install the carried wheel (.whl/) into /tmp/site and put it on PYTHONPATH.
if ! python3 -c "import cutlass_library" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
