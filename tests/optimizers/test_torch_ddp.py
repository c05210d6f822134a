"""LARSMixed under torch's DistributedDataParallel, which Keras' torch
`fit` wraps the model in from Keras 3.16 when `torch.distributed` is
initialized (keras-team/keras#23316): DDP averages the loss-scaled
gradients inside `loss.backward()`, before `optimizer.apply`, so the
finiteness check and the unscaling see the reduced gradients."""

import os
import sys

import keras
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
import torch_processes  # noqa: E402

pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "torch",
                       reason="torch's DistributedDataParallel"),
    pytest.mark.skipif(
        tuple(int(p) for p in keras.__version__.split(".")[:2]) < (3, 16),
        reason=f"Keras {keras.__version__}: `fit` wraps the model in "
               "DistributedDataParallel from Keras 3.16"),
]

WORKER = os.path.join(os.path.dirname(__file__), "torch_ddp_fit.py")


def _load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def test_two_gloo_processes_train_as_one_process_on_the_global_batch(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    torch_processes.run(WORKER, one)
    torch_processes.run(WORKER, two, nproc=2)
    alone = _load(one / "rank0.npz")
    ranks = [_load(two / f"rank{r}.npz") for r in (0, 1)]
    # The non-finite batch of rank 1 was skipped by both ranks, as alone.
    assert float(alone["scale"]) == 2.0**9
    assert int(alone["iterations"]) == 3
    for rank in ranks:
        assert float(rank["scale"]) == float(alone["scale"])
        assert int(rank["iterations"]) == int(alone["iterations"])
        for name in alone:
            np.testing.assert_array_equal(rank[name], ranks[0][name])
            np.testing.assert_allclose(rank[name], alone[name], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
