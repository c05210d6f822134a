#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the whole suite once per
# Keras backend, then the command, data and optimizer tests on JAX and torch
# in a second environment without TensorFlow, then the CUDA build job: in a
# third environment, TensorFlow's CUDA build and the package built with this
# machine's nvcc, its library checked for device code and its ops tested on
# the CPU kernels (skipped, with a message, where there is no nvcc).
# Usage: bash tests/run.sh [--no-install] [pytest args...]
#   BACKENDS="jax torch" bash tests/run.sh     # a subset of backends
#   NO_TF_JOB=0 bash tests/run.sh              # without the TF-free job
#   CUDA_JOB=0 bash tests/run.sh               # without the CUDA build job
#   CUDA_JOB=only bash tests/run.sh            # the CUDA build job alone
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NO_TF_VENV=.venv-notf
CUDA_VENV=.venv-cuda
CUDA_JOB=${CUDA_JOB:-1}
main_jobs=1
[ "$CUDA_JOB" = only ] && main_jobs=0
# The tests of the command, its data and the optimizers, and the GPU
# campaign's smoke run (here only); the multi-process
# ones ran above.
NO_TF_TESTS=(tests/train tests/optimizers
             --deselect tests/train/test_train_processes.py
             --deselect tests/train/test_train_without_tensorflow.py
             --deselect tests/train/test_train_adaptive_batch.py::test_two_jax_processes_grow_the_batch_as_one_process)
[ -d tests/bench ] && NO_TF_TESTS+=(tests/bench)

if [ "${1:-}" = "--no-install" ]; then
  shift
  install=0
else
  install=1
fi
if [ "$install" = 1 ] && [ "$main_jobs" = 1 ]; then
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
if [ "$main_jobs" = 1 ]; then
  for backend in ${BACKENDS:-tensorflow jax torch}; do
    echo "=== KERAS_BACKEND=$backend"
    # PYTHONSAFEPATH: import the installed package, not ./keras_largebatch
    # (the installed one has applications/ mapped in and the native library).
    KERAS_BACKEND=$backend PYTHONSAFEPATH=1 TF_CPP_MIN_LOG_LEVEL=2 \
      "$PY" -m pytest -q -p no:cacheprovider --ignore=tests/bench "$@" || status=1
  done
fi

if [ "$main_jobs" = 1 ] && [ "${NO_TF_JOB:-1}" = 1 ]; then
  if [ "$install" = 1 ]; then
    set -e
    rm -rf "$NO_TF_VENV"
    "$PY" -m venv "$NO_TF_VENV"
    "$NO_TF_VENV/bin/pip" install --quiet --upgrade pip
    "$NO_TF_VENV/bin/pip" install --quiet jax "torch==2.13.0"
    KERAS_LARGEBATCH_BUILD_NATIVE=0 "$NO_TF_VENV/bin/pip" install --quiet ".[test]"
    set +e
  fi
  if "$NO_TF_VENV/bin/python" -c "import tensorflow" 2>/dev/null; then
    echo "error: $NO_TF_VENV has TensorFlow"; status=1
  fi
  for backend in jax torch; do
    echo "=== KERAS_BACKEND=$backend, without TensorFlow"
    KERAS_BACKEND=$backend PYTHONSAFEPATH=1 \
      "$NO_TF_VENV/bin/python" -m pytest -q -p no:cacheprovider \
      "${NO_TF_TESTS[@]}" "$@" || status=1
  done
fi

if [ "$CUDA_JOB" != 0 ]; then
  echo "=== CUDA build: TensorFlow's CUDA build, nvcc, device code, native ops"
  if [ -z "${CUDA_HOME:-}${CUDA_PATH:-}" ] && ! command -v nvcc >/dev/null \
      && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "skipped: no nvcc (not on the PATH, no CUDA_HOME or CUDA_PATH, no /usr/local/cuda)"
  else
    if [ "$install" = 1 ]; then
      set -e
      rm -rf "$CUDA_VENV"
      "$PY" -m venv "$CUDA_VENV"
      "$CUDA_VENV/bin/pip" install --quiet --upgrade pip
      "$CUDA_VENV/bin/pip" install --quiet tensorflow   # the CUDA build
      # =cuda: the install fails unless the CUDA kernels are built.
      KERAS_LARGEBATCH_BUILD_NATIVE=cuda "$CUDA_VENV/bin/pip" install --quiet ".[test]"
      set +e
    fi
    KERAS_LARGEBATCH_BUILD_NATIVE=cuda KERAS_BACKEND=tensorflow PYTHONSAFEPATH=1 \
      TF_CPP_MIN_LOG_LEVEL=2 "$CUDA_VENV/bin/python" -m pytest -q -p no:cacheprovider \
      tests/test_native_build.py tests/distribute/test_native_ops.py "$@" || status=1
    # The kernels' device test (native/tests/), built as the GPU campaign
    # builds it, from pack_eigen.py's tarball: with nvcc for one architecture
    # (it runs only on a GPU), and host-only, run against a scalar loop.
    eigen_tar=$(mktemp -d)/eigen.tar.gz
    "$CUDA_VENV/bin/python" native/tests/pack_eigen.py "$eigen_tar" || status=1
    bash native/tests/device_test.sh --eigen-tar "$eigen_tar" --arch sm_90 \
      --compile-only || status=1
    bash native/tests/device_test.sh --eigen-tar "$eigen_tar" --cpu-only | tail -1
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    rm -rf "$(dirname "$eigen_tar")"
  fi
fi
exit $status
