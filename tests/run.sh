#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the whole suite once per
# Keras backend. Usage: bash tests/run.sh [--no-install] [pytest args...]
#   BACKENDS="jax torch" bash tests/run.sh     # a subset of backends
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" = "--no-install" ]; then
  shift
else
  set -e
  # CPU builds: tensorflow-cpu, jax, and the torch 2.13.0 CPU wheel (plain
  # `torch` would pull several GB of CUDA packages).
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet tensorflow-cpu jax "torch==2.13.0"
  # Fashion-MNIST's IDX files (Debian's package, MIT) for the data tests;
  # without root or apt the tests that need them are skipped.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; } \
      >/dev/null 2>&1 || echo "note: dataset-fashion-mnist not installed"
  fi
  # TensorFlow first: `pip install .` compiles the native ops against it.
  "$PY" -m pip install --quiet ".[test]"
  set +e
fi

status=0
for backend in ${BACKENDS:-tensorflow jax torch}; do
  echo "=== KERAS_BACKEND=$backend"
  # PYTHONSAFEPATH: import the installed package, not ./keras_largebatch
  # (the installed one has applications/ mapped in and the native library).
  KERAS_BACKEND=$backend PYTHONSAFEPATH=1 TF_CPP_MIN_LOG_LEVEL=2 \
    "$PY" -m pytest -q -p no:cacheprovider "$@" || status=1
done
exit $status
