#!/usr/bin/env bash
# The GPU image rehearsed on this CPU (bench/README.md): a Python 3.12 venv
# with the image's packages, every other one only from the folder
# `--prepare` makes, then `python -m bench.gpu_campaign --smoke` with the
# repository on PYTHONPATH. Steps 1 and 2 need the network; PYTHON312 names
# the interpreter.
#
#   bench/gpu_campaign/rehearsal.sh [WORK]   # default /tmp/gpu_campaign_rehearsal
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mkdir -p "${1:-/tmp/gpu_campaign_rehearsal}" && cd "${1:-/tmp/gpu_campaign_rehearsal}" && pwd)
PYTHON312=${PYTHON312:-$HOME/.pyenv/versions/3.12.1/bin/python}
IMAGE=(jax==0.11.2 jaxlib==0.11.2 numpy optax absl-py h5py ml-dtypes rich
       matplotlib tensorboard)
VENV_PY=$WORK/venv/bin/python

echo "== 1. the image's packages, Python $("$PYTHON312" -c 'import platform; print(platform.python_version())')"
[ -x "$VENV_PY" ] || "$PYTHON312" -m venv "$WORK/venv"
"$VENV_PY" -m pip install -q "${IMAGE[@]}"

echo "== 2. the prepared folder (python3 of the repository, with the network)"
(cd "$ROOT" && python3 -m bench.gpu_campaign --prepare "$WORK/prepared") | tail -n 4

echo "== 3. the prepared wheels and what they need, from that folder alone"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL \
  PIP_CONFIG_FILE=/dev/null "$VENV_PY" -m pip install -q --no-index \
  --find-links "$WORK/prepared/wheels" "$WORK"/prepared/wheels/*.whl
"$VENV_PY" -m pip list --format=freeze

echo "== 4. the smoke"
rm -rf "$WORK/smoke"
cd "$WORK"
time PYTHONPATH="$ROOT" "$VENV_PY" -m bench.gpu_campaign --smoke \
  --out "$WORK/smoke/campaign" --data_dir "$WORK/prepared/fashion-mnist"
