"""`--distribution=data_parallel` on torch: the command under `torchrun`,
each process one rank of torch's DistributedDataParallel, which Keras'
torch `fit` wraps the model in from Keras 3.16 (keras-team/keras#23316).

The optimizer alone under DDP (a non-finite slice skipped by every rank)
is `tests/optimizers/test_torch_ddp.py`; here it is the command: the
process group from torchrun's variables, the chief, each process's slice
of the global batch, and a resume after a lost process.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import localhost
from keras_largebatch.train.run import placement
from keras_largebatch.train.run.processes import torch_cluster

# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The command with a model that has no batch norm or dropout (their state
# is per process under DDP); KILL_AT_EPOCH_STEP ends rank KILL_RANK.
SCRIPT = os.path.join(HERE, "ddp_command.py")
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=3", "--epochs=3", "--augment=crop_flip",
        "--image_size=67", "--warmup_epochs=0.5", "--verbose=2",
        "--optimizer=lars_mixed", "--precision=mixed_float16",
        "--collective_timeout_seconds=60"]
KERAS = tuple(int(p) for p in keras.__version__.split(".")[:2])
HAS_TORCH = importlib.util.find_spec("torch") is not None
DDP_KERAS = pytest.mark.skipif(
    KERAS < placement.TORCH_DDP_KERAS or not HAS_TORCH,
    reason=f"Keras {keras.__version__}: torch's `fit` wraps the model in "
           "DistributedDataParallel from Keras 3.16 (.venv-nightly has it: "
           "tests/nightly.sh)")


def _env(**extra):
    """The command's environment: torch, this checkout, no torchrun
    variables of the caller's."""
    env = dict(os.environ, KERAS_BACKEND="torch", OMP_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="3", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join(
                   [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "KERAS_DISTRIBUTION_NUM_PROCESSES"):
        env.pop(name, None)
    env.update(extra)
    return env


def _command(model_dir, ranks, timeout=300, **env):
    """The command on `ranks` processes (`torchrun` on loopback; alone, no
    torchrun and `--distribution=none`); returns (exit code, output)."""
    args = [*ARGS, f"--model_dir={model_dir}"]
    if ranks == 1:
        command = [sys.executable, SCRIPT, *args]
    else:
        port = localhost.free_ports(1)[0]
        command = [sys.executable, "-m", "torch.distributed.run",
                   "--nnodes=1", f"--nproc_per_node={ranks}",
                   "--master_addr=127.0.0.1", f"--master_port={port}",
                   SCRIPT, "--distribution=data_parallel", *args]
    proc = subprocess.Popen(command, env=_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:  # torchrun and its workers: the whole session.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait(), output


def _weights(model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"),
                                    compile=False)
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_variables_give_rank_world_size_and_local_rank(
        monkeypatch):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    assert torch_cluster.cluster() is None  # Not under torchrun.
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert torch_cluster.cluster() == (1, 2, 1)


@pytest.mark.parametrize("name, value, message", [
    ("RANK", "2", "`RANK` must be in [0, 2) (WORLD_SIZE=2). Received: RANK=2"),
    ("WORLD_SIZE", "two", "Received: WORLD_SIZE='two'"),
    ("LOCAL_RANK", None, "Received: LOCAL_RANK=None"),
    ("MASTER_ADDR", "", "`MASTER_ADDR` must be rank 0's host"),
])
def test_bad_torchrun_variable_is_named(name, value, message, monkeypatch):
    for variable, setting in dict(TORCHRUN, **{name: value}).items():
        if setting is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, setting)
    with pytest.raises(ValueError, match=re.escape(message)):
        torch_cluster.cluster()


def _refusal(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "keras_largebatch.train.cli",
         "--distribution=data_parallel", *ARGS,
         f"--model_dir={tmp_path}/run"],
        env=_env(), capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "run")
    return errors[0]


@pytest.mark.skipif(KERAS >= placement.TORCH_DDP_KERAS or not HAS_TORCH,
                    reason="Keras >= 3.16 runs it (torch installed)")
def test_before_keras_3_16_torch_data_parallel_exits_2_naming_the_version(
        tmp_path):
    error = _refusal(tmp_path)
    assert "needs Keras >= 3.16" in error
    assert f"Keras {keras.__version__} is installed" in error


@DDP_KERAS
def test_torch_data_parallel_outside_torchrun_exits_2_with_one_line(
        tmp_path):
    assert "runs under torchrun" in _refusal(tmp_path)


@DDP_KERAS
@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the torch run (once, not per backend)")
def test_two_torchrun_processes_train_as_one_and_resume_after_a_lost_rank(
        tmp_path):
    code, log = _command(tmp_path / "one", 1)
    assert code == 0, log[-3000:]
    code, log = _command(tmp_path / "two", 2)
    assert code == 0, log[-3000:]
    reference, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    # float16 activations summed over 16 rows per process, not 32: a few
    # float16 roundings (float32 gives 2e-8 here). A rank training alone on
    # its half (no reduction) ends ~0.3 away.
    difference = np.abs(two - reference).max()
    print(f"max abs weight difference, 2 ranks vs 1: {difference:.3g}")
    assert difference <= 1e-3
    # Only the chief writes; the other rank says so.
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["replicas"] == 2 and summary["backend"] == "torch"
    assert not [p for p in os.listdir(tmp_path / "two")
                if p.startswith("worker_")]
    assert "(not the chief: no summary)" in log

    # Rank 1 dies in epoch 2: torchrun ends rank 0 and fails.
    code, log = _command(tmp_path / "resumed", 2, KILL_AT_EPOCH_STEP="1,1")
    assert code != 0, log[-3000:]
    assert not (tmp_path / "resumed" / "final.keras").exists()
    # The same command again: both ranks resume from the chief's backup
    # and end where the unbroken job ends.
    code, log = _command(tmp_path / "resumed", 2)
    assert code == 0, log[-3000:]
    assert "Epoch 2/3" in log and "Epoch 1/3" not in log, log[-3000:]
    np.testing.assert_allclose(_weights(tmp_path / "resumed"), two,
                               rtol=0, atol=1e-6)
