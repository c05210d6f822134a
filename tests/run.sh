#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the suite on each Keras
# backend, each test where its code varies (tests/conftest.py, `_where`):
# - the main environment (TensorFlow, JAX, torch) on TensorFlow: every test
#   but the backend-independent ones, which run once, on JAX;
# - on JAX and torch, the command's, the optimizers' and the layers' tests
#   in a second environment without TensorFlow, but for those marked
#   `tensorflow` or `multi_process`, which the main environment runs with
#   the other folders' tests (NO_TF_JOB=0: all in the main environment);
# - the GPU check's and the study's tests (tests/bench) once, on JAX
#   without TensorFlow;
# - then the CUDA build job: TensorFlow's CUDA build and the package built
#   with this machine's nvcc in a third environment, its library checked for
#   device code and its ops tested on the CPU kernels (skipped, with a
#   message, where there is no nvcc).
# Every step prints its 25 slowest tests and its wall time; the steps' times
# end the output, and each step's junit XML (every test's seconds) is left
# in test-results/ (`python tests/durations.py` turns them into
# tests/durations.json, which orders the files, costliest first).
# JAX processes share a persistent compilation cache (.cache/jax).
#
# Usage: bash tests/run.sh [--no-install] [--fast] [pytest args...]
#   --fast                                     # development: no installs, one
#                                              # backend (BACKENDS, default
#                                              # jax), one environment, the
#                                              # tests not marked `slow`
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
RESULTS=${TEST_RESULTS:-test-results}
CUDA_JOB=${CUDA_JOB:-1}
NO_TF_JOB=${NO_TF_JOB:-1}
main_jobs=1
[ "$CUDA_JOB" = only ] && main_jobs=0

install=1 fast=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) install=0; shift ;;
    --fast) fast=1; install=0; shift ;;
    *) break ;;
  esac
done
if [ "$fast" = 1 ]; then
  BACKENDS=${BACKENDS:-jax}
  NO_TF_JOB=0 CUDA_JOB=0
fi

# Two pytest processes on the suites (most tests wait on the processes they
# start); a test file stays on one worker, so its fixtures are built once.
# Files go to the workers in collection order, which tests/conftest.py
# starts with the costliest (xdist's own reorder goes by the number of
# tests, which put the few long tests of jobs in subprocesses last).
PARALLEL=(-n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
REPORT=(-q -p no:cacheprovider --durations=25)
NO_TF_TESTS=(tests/train tests/optimizers tests/layers)
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
mkdir -p "$RESULTS" "$JAX_COMPILATION_CACHE_DIR"

steps=() status=0
# step NAME COMMAND...: runs it, prints and keeps its wall time.
step() {
  local name=$1 start=$SECONDS rc
  shift
  echo "=== $name"
  "$@"
  rc=$?
  steps+=("$(printf '| %s | %d | %d |' "$name" $((SECONDS - start)) "$rc")")
  echo "=== $name: $((SECONDS - start)) s, exit $rc"
  [ "$rc" = 0 ] || status=1
  return "$rc"
}
# suite NAME PYTHON [pytest args...]: one pytest run, its junit XML kept.
suite() {
  local name=$1 py=$2
  shift 2
  step "$name" env PYTHONSAFEPATH=1 TF_CPP_MIN_LOG_LEVEL=2 \
    "$py" -m pytest "${REPORT[@]}" "${PARALLEL[@]}" \
    --junitxml="$RESULTS/$name.xml" "$@"
}

# The installs: each command's failure ends its step (`&&`: `set -e` does
# not apply within a function called from `step ... ||`).
install_main() {
  # CPU builds: tensorflow-cpu, jax, and the torch 2.13.0 CPU wheel (plain
  # `torch` would pull several GB of CUDA packages).
  "$PY" -m pip install --quiet --upgrade pip \
    && "$PY" -m pip install --quiet tensorflow-cpu jax "torch==2.13.0" \
    || return 1
  # Fashion-MNIST's IDX files (Debian's package, MIT) for the data tests;
  # without root or apt the tests that need them are skipped.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; } \
      >/dev/null 2>&1 || echo "note: dataset-fashion-mnist not installed"
  fi
  # TensorFlow first: `pip install .` compiles the native ops against it.
  "$PY" -m pip install --quiet ".[test]"
}

install_no_tf() {
  rm -rf "$NO_TF_VENV" && "$PY" -m venv "$NO_TF_VENV" \
    && "$NO_TF_VENV/bin/pip" install --quiet --upgrade pip \
    && "$NO_TF_VENV/bin/pip" install --quiet jax "torch==2.13.0" \
    && KERAS_LARGEBATCH_BUILD_NATIVE=0 "$NO_TF_VENV/bin/pip" install --quiet \
      ".[test]"
}

install_cuda() {
  # TensorFlow's CUDA build; KERAS_LARGEBATCH_BUILD_NATIVE=cuda: the install
  # fails unless the CUDA kernels are built.
  rm -rf "$CUDA_VENV" && "$PY" -m venv "$CUDA_VENV" \
    && "$CUDA_VENV/bin/pip" install --quiet --upgrade pip \
    && "$CUDA_VENV/bin/pip" install --quiet tensorflow \
    && KERAS_LARGEBATCH_BUILD_NATIVE=cuda "$CUDA_VENV/bin/pip" install \
      --quiet ".[test]"
}

has_nvcc() {
  [ -n "${CUDA_HOME:-}${CUDA_PATH:-}" ] || command -v nvcc >/dev/null \
    || [ -x /usr/local/cuda/bin/nvcc ]
}

cuda_checks() {
  # The kernels' device test (native/tests/), built as the GPU campaign
  # builds it, from pack_eigen.py's tarball: with nvcc for one architecture
  # (it runs only on a GPU), and host-only, run against a scalar loop.
  local eigen_tar rc=0
  eigen_tar=$(mktemp -d)/eigen.tar.gz
  "$CUDA_VENV/bin/python" native/tests/pack_eigen.py "$eigen_tar" || rc=1
  bash native/tests/device_test.sh --eigen-tar "$eigen_tar" --arch sm_90 \
    --compile-only || rc=1
  bash native/tests/device_test.sh --eigen-tar "$eigen_tar" --cpu-only | tail -1
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  rm -rf "$(dirname "$eigen_tar")"
  return "$rc"
}

if [ "$install" = 1 ] && [ "$main_jobs" = 1 ]; then
  step "install: main environment" install_main || exit 1
fi

if [ "$main_jobs" = 1 ]; then
  for backend in ${BACKENDS:-tensorflow jax torch}; do
    if [ "$fast" = 1 ]; then
      KERAS_BACKEND=$backend suite "fast-$backend" "$PY" -m "not slow" \
        tests "$@"
      continue
    fi
    # KLB_TEST_ENV: the environment this is, for tests/conftest.py's choice.
    KLB_TEST_ENV=main KERAS_BACKEND=$backend suite "main-$backend" "$PY" \
      --ignore=tests/bench tests "$@"
  done
fi

if [ "$main_jobs" = 1 ] && [ "$NO_TF_JOB" = 1 ]; then
  if [ "$install" = 1 ]; then
    step "install: environment without TensorFlow" install_no_tf || exit 1
  fi
  if "$NO_TF_VENV/bin/python" -c "import tensorflow" 2>/dev/null; then
    echo "error: $NO_TF_VENV has TensorFlow"; status=1
  fi
  for backend in jax torch; do
    bench=()
    [ "$backend" = jax ] && [ -d tests/bench ] && bench=(tests/bench)
    KLB_TEST_ENV=no_tf KERAS_BACKEND=$backend suite "no_tf-$backend" \
      "$NO_TF_VENV/bin/python" "${NO_TF_TESTS[@]}" "${bench[@]}" "$@"
  done
fi

if [ "$CUDA_JOB" != 0 ]; then
  if ! has_nvcc; then
    echo "=== CUDA build skipped: no nvcc (not on the PATH, no CUDA_HOME or" \
      "CUDA_PATH, no /usr/local/cuda)"
  else
    if [ "$install" = 1 ]; then
      step "install: CUDA build" install_cuda || status=1
    fi
    KERAS_LARGEBATCH_BUILD_NATIVE=cuda KERAS_BACKEND=tensorflow \
      suite "cuda-native" "$CUDA_VENV/bin/python" -n 0 \
      tests/test_native_build.py tests/distribute/test_native_ops.py "$@"
    step "cuda: device test" cuda_checks
  fi
fi

echo
echo "| step | seconds | exit |"
echo "|---|---|---|"
printf '%s\n' "${steps[@]}"
echo "| all | $SECONDS | $status |"
exit $status
