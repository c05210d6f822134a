"""The layers' torch path against the JAX backend: the same network, fixed
weights and inputs (`backend_reference.py`), computed in one process per
backend; outputs, gradients, moving statistics after three training passes
and inference outputs agree, float32 and mixed_float16."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the layers' torch path")

WORKER = os.path.join(os.path.dirname(__file__), "backend_reference.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TOLERANCE = {"float32": 1e-4, "mixed_float16": 2e-2}


def _computed(backend, out):
    env = dict(os.environ, KERAS_BACKEND=backend, OMP_NUM_THREADS="1",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(
                   [ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, WORKER, str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out / f"{backend}.npz") as f:
        return {k: f[k] for k in f.files}


def test_torch_path_computes_what_jax_computes(tmp_path):
    torch_, jax_ = (_computed(b, tmp_path) for b in ("torch", "jax"))
    assert torch_.keys() == jax_.keys()
    assert any("moving_variance" in k for k in torch_)
    for key, want in jax_.items():
        tol = TOLERANCE[key.split("/")[0]]
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(torch_[key], want, rtol=tol,
                                   atol=tol * scale, err_msg=key)
