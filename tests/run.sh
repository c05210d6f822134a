#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the suite on each Keras
# backend: on JAX and torch, the command's and the optimizers' tests in a
# second environment without TensorFlow (NO_TF_JOB=0: all in the first),
# then the CUDA build job: in a
# third environment, TensorFlow's CUDA build and the package built with this
# machine's nvcc, its library checked for device code and its ops tested on
# the CPU kernels (skipped, with a message, where there is no nvcc).
# Usage: bash tests/run.sh [--no-install] [pytest args...]
#   BACKENDS="jax torch" bash tests/run.sh     # a subset of backends
#   NO_TF_JOB=0 bash tests/run.sh              # without the TF-free job
#   CUDA_JOB=0 bash tests/run.sh               # without the CUDA build job
#   CUDA_JOB=only bash tests/run.sh            # the CUDA build job alone
#   TEST_WORKERS=0 bash tests/run.sh           # one pytest process (default 2,
#                                              # pytest-xdist, a file per worker)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NO_TF_VENV=.venv-notf
CUDA_VENV=.venv-cuda
CUDA_JOB=${CUDA_JOB:-1}
main_jobs=1
[ "$CUDA_JOB" = only ] && main_jobs=0
# Two pytest processes on the suites (most tests wait on the processes they
# start); a test file stays on one worker, so its fixtures are built once.
# Files go to the workers in collection order, which tests/conftest.py
# starts with the costliest (xdist's own reorder goes by the number of
# tests, which put the few long tests of jobs in subprocesses last).
PARALLEL=(-n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
# On JAX and torch, the tests of the command, the optimizers and the layers run once,
# in the environment without TensorFlow (their data is Grain's there and
# here); the main environment runs, of tests/train, the files that use
# TensorFlow (tf.data, TFRecords, the TF-free checks) and the multi-process
# ones. The GPU check's and the study's tests (tests/bench) run once, on JAX
# without TensorFlow.
MULTI_PROCESS=(tests/train/run/test_train_processes.py
               tests/train/run/test_train_adaptive_batch.py::test_two_jax_processes_grow_the_batch_as_one_process)
NO_TF_TESTS=(tests/train tests/optimizers tests/layers
             --deselect tests/train/test_train_without_tensorflow.py)
for test in "${MULTI_PROCESS[@]}"; do NO_TF_TESTS+=(--deselect "$test"); done
MAIN_TESTS=(tests/adaptive_batch tests/applications tests/distribute
            tests/noise_scale tests/package tests/test_*.py
            "${MULTI_PROCESS[@]}"
            $(grep -rlE 'importorskip\("tensorflow"\)|import tensorflow|tf_data' \
              tests/train --include='test_*.py' | sort))

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
    selected=(--ignore=tests/bench)
    if [ "$backend" != tensorflow ] && [ "${NO_TF_JOB:-1}" = 1 ]; then
      selected=("${MAIN_TESTS[@]}")
    fi
    # PYTHONSAFEPATH: import the installed package, not ./keras_largebatch
    # (the installed one has applications/ mapped in and the native library).
    KERAS_BACKEND=$backend PYTHONSAFEPATH=1 TF_CPP_MIN_LOG_LEVEL=2 \
      "$PY" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" "${selected[@]}" "$@" \
      || status=1
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
    bench=()
    [ "$backend" = jax ] && [ -d tests/bench ] && bench=(tests/bench)
    KERAS_BACKEND=$backend PYTHONSAFEPATH=1 \
      "$NO_TF_VENV/bin/python" -m pytest -q -p no:cacheprovider \
      "${PARALLEL[@]}" "${NO_TF_TESTS[@]}" "${bench[@]}" "$@" || status=1
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
