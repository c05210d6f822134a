#!/usr/bin/env bash
# The suites that lean on Keras' private optimizer API, against the newest
# `keras-nightly`, on each backend: what to run before a Keras release ships
# (docs/keras-versions.md records the last run). Not part of CI.
# It keeps its own environment, .venv-nightly: created on the first run with
# tensorflow-cpu, jax and the torch 2.13.0 CPU wheel; every run then upgrades
# keras-nightly to the newest and installs the package from this checkout,
# editable, with --no-deps (the pin `keras<3.16` would refuse the nightly)
# and without building its native ops.
# Usage: bash tests/nightly.sh [--no-install] [pytest args...]
#   BACKENDS=jax bash tests/nightly.sh        # a subset of backends
#   TEST_WORKERS=0 bash tests/nightly.sh      # one pytest process (default 2)
#   rm -rf .venv-nightly                      # to start from nothing
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-nightly
SUITES=(tests/optimizers tests/test_keras_private_api.py tests/noise_scale
        tests/adaptive_batch)
PARALLEL=()
[ "${TEST_WORKERS:-2}" != 0 ] && PARALLEL=(-n "${TEST_WORKERS:-2}" --dist loadfile)

install=1
if [ "${1:-}" = "--no-install" ]; then
  shift
  install=0
fi
if [ "$install" = 1 ]; then
  set -e
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet tensorflow-cpu jax "torch==2.13.0"
    "$VENV/bin/pip" install --quiet numpy absl-py scikit-learn matplotlib pillow \
      "grain>=0.2.10" tensorboardX pytest pytest-xdist hypothesis h5py optax
  fi
  # tensorflow-cpu brings the released `keras`; keras-nightly installs the
  # same `keras/` folder, so the release goes first.
  "$VENV/bin/pip" uninstall --quiet --yes keras 2>/dev/null || true
  "$VENV/bin/pip" install --quiet --upgrade --pre keras-nightly
  # Editable: the tests import this checkout as it is now.
  KERAS_LARGEBATCH_BUILD_NATIVE=0 "$VENV/bin/pip" install --quiet --no-deps \
    --force-reinstall --editable .
  set +e
fi

KERAS_BACKEND=jax "$VENV/bin/python" -c "import keras; print('keras', keras.__version__)"
status=0
for backend in ${BACKENDS:-jax torch tensorflow}; do
  echo "=== KERAS_BACKEND=$backend"
  # PYTHONSAFEPATH: the package through its install (applications/ mapped
  # in), not ./keras_largebatch as a plain folder.
  KERAS_BACKEND=$backend PYTHONSAFEPATH=1 TF_CPP_MIN_LOG_LEVEL=2 \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" \
    "${SUITES[@]}" "$@" || status=1
done
exit $status
