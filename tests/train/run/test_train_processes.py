"""Jobs of several processes on localhost: JAX's keras.distribution, and a
lost process or worker (JAX and TensorFlow)."""

import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import localhost

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.multi_process
# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=3", "--epochs=3", "--augment=crop_flip",
        "--image_size=67", "--warmup_epochs=0.5", "--verbose=2",
        "--collective_timeout_seconds=20"]
# The command with conftest's `small_model`; KILL_AT_EPOCH_STEP ends it.
SCRIPT = os.path.join(HERE, "small_command.py")


def _jax_job(model_dir, processes, devices, kill=None, extra=()):
    """Runs `processes` JAX processes of `devices` CPU devices each; returns
    [(exit code, stdout + stderr)]."""
    port = localhost.free_ports(1)[0]
    procs = []
    for index in range(processes):
        env = dict(os.environ, KERAS_BACKEND="jax",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count="
                             f"{devices}")
        if processes > 1:
            env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                       KERAS_DISTRIBUTION_NUM_PROCESSES=str(processes),
                       KERAS_DISTRIBUTION_PROCESS_ID=str(index))
        if kill and kill[0] == index:
            env["KILL_AT_EPOCH_STEP"] = kill[1]
        procs.append(subprocess.Popen(
            [sys.executable, SCRIPT, "--distribution=data_parallel",
             *ARGS, *extra, f"--model_dir={model_dir}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    try:
        return [(p.wait(timeout=300), p.stdout.read() + p.stderr.read())
                for p in procs]
    finally:
        localhost.kill(procs)


def _weights(model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"))
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution on JAX")
def test_two_processes_train_as_one_resume_and_end_on_a_lost_peer(tmp_path):
    one = _jax_job(tmp_path / "one", 1, 4)
    assert one[0][0] == 0, one[0][1][-3000:]
    two = _jax_job(tmp_path / "two", 2, 2)
    for code, log in two:
        assert code == 0, log[-3000:]
    reference = _weights(tmp_path / "one")
    distance = np.linalg.norm(_weights(tmp_path / "two") - reference)
    assert distance <= 1e-4 * np.linalg.norm(reference)
    # Only the chief writes; both say where the summary is.
    assert json.loads((tmp_path / "two" / "summary.json").read_text())[
        "replicas"] == 4
    assert not [p for p in os.listdir(tmp_path / "two")
                if p.startswith("worker_")]
    assert "(not the chief: no summary)" in two[1][1]

    # Process 1 dies in epoch 2: process 0 ends with one line naming it.
    start = time.monotonic()
    killed = _jax_job(tmp_path / "resumed", 2, 2, kill=(1, "1,1"))
    assert time.monotonic() - start < 200
    code, log = killed[0]
    assert code != 0
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    assert "process 1 of 2 was lost" in errors[0]
    assert "start all 2 processes again" in errors[0]
    # The same command again resumes and ends where the unbroken job ends.
    again = _jax_job(tmp_path / "resumed", 2, 2)
    for code, log in again:
        assert code == 0, log[-3000:]
    assert "Epoch 2/3" in again[0][1] and "Epoch 1/3" not in again[0][1]
    np.testing.assert_allclose(_weights(tmp_path / "resumed"),
                               _weights(tmp_path / "two"), rtol=0, atol=1e-6)


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution on JAX")
@pytest.mark.parametrize("env, message", [
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "2",
      "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1"},
     "KERAS_DISTRIBUTION_PROCESS_ID=2"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "1",
      "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:{port}"},
     "could not join the job at the coordinator 127.0.0.1:"),
])
def test_bad_process_set_up_exits_2_with_one_line(env, message, tmp_path):
    port = localhost.free_ports(1)[0]  # Nobody listens there.
    env = {k: v.format(port=port) for k, v in env.items()}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--distribution=data_parallel",
         *ARGS, "--collective_timeout_seconds=3",
         f"--model_dir={tmp_path}/run"],
        env=dict(os.environ, KERAS_BACKEND="jax", **env),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, (
        proc.stderr)
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow strategy")
def test_a_killed_tensorflow_worker_ends_its_peer_with_one_line(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, SCRIPT, "--distribution=multi_worker",
               *ARGS, f"--model_dir={tmp_path}/run"]
    logs = [tmp_path / f"worker_{i}.log" for i in range(2)]
    procs = localhost.start([command, command], logs=logs, env=env)
    try:
        deadline = time.monotonic() + 240
        while "Epoch 2/3" not in logs[1].read_text():
            assert time.monotonic() < deadline, logs[1].read_text()[-3000:]
            assert procs[1].poll() is None, logs[1].read_text()[-3000:]
            time.sleep(0.2)
        procs[1].kill()
        assert procs[0].wait(timeout=120) == 1
    finally:
        localhost.kill(procs)
    log = logs[0].read_text()
    errors = [line for line in log.splitlines()
              if line.startswith("keras-largebatch-train: error:")]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    assert "lost worker 1 of 2" in errors[0]
    assert "start all 2 workers again" in errors[0]
