"""An application of `keras_largebatch.layers` under torch's
DistributedDataParallel: two gloo processes on loopback each take a slice
of the batch, and the gradients they step with are the mean of the slices'
gradients computed alone (each slice's batch statistics are its own, as
without SyncBatchNorm); the weights after the step agree on both."""

import os
import sys

import keras
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
import torch_processes  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="torch's DistributedDataParallel")

WORKER = os.path.join(os.path.dirname(__file__), "torch_ddp_step.py")


def _load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def test_two_gloo_processes_step_with_the_mean_of_the_slices_gradients(
        tmp_path):
    torch_processes.run(WORKER, tmp_path, timeout=120)
    torch_processes.run(WORKER, tmp_path, nproc=2, timeout=120)
    alone = _load(tmp_path / "alone.npz")
    ranks = [_load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    # The slices' gradients differ: averaging them is visible.
    assert not np.allclose(alone["slice0_g0"], alone["slice1_g0"])
    names = [k for k in ranks[0] if k[0] in "gw"]
    assert names and all(k in alone for k in names)
    for name in names:
        np.testing.assert_array_equal(ranks[1][name], ranks[0][name])
        np.testing.assert_allclose(ranks[0][name], alone[name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)
    # Each process's moving statistics are its own slice's.
    assert not np.allclose(ranks[0]["m0"], ranks[1]["m0"])
