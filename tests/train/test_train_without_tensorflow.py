"""The command on JAX and torch with TensorFlow made unimportable."""

import json
import os
import subprocess
import sys

import keras
import pytest

BACKEND = keras.backend.backend()
# TensorFlow installed and made unimportable: the main environment's.
pytestmark = [pytest.mark.tensorflow,
              pytest.mark.skipif(BACKEND == "tensorflow",
                                 reason="the JAX and torch path")]

# Whether or not TensorFlow is installed, the command's process cannot
# import it (and so would fail on any use of it).
_WITHOUT_TF = """
import sys
# None in sys.modules: `import tensorflow` raises ModuleNotFoundError and
# importlib.util.find_spec returns None, as when it is not installed.
sys.modules["tensorflow"] = None
from keras_largebatch.train.cli import run
run()
"""


def _command(*args, timeout=600):
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    return subprocess.run([sys.executable, "-c", _WITHOUT_TF, *args],
                          env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_default_run_logs_one_line_per_epoch_without_tensorflow(tmp_path):
    proc = _command(f"--model_dir={tmp_path}/run", "--epochs=2",
                    "--steps_per_epoch=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"] == "alexnet_bn" and summary["dataset"] == "digits"
    assert summary["optimizer"] == "lars_mixed"
    # stdout is a pipe: one line per epoch, no redrawn progress bar.
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("3/3 - ") for line in lines) == 2, lines
    assert "\x1b[" not in proc.stdout and "\u2501" not in proc.stdout
    assert "Traceback" not in proc.stderr
    tensorboard = tmp_path / "run" / "tensorboard"
    assert os.listdir(tensorboard / "train")
    assert os.listdir(tensorboard / "validation")
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["input_pipeline"] == "auto"


def test_fashion_mnist_resnet_cifar_steps_without_tensorflow(tmp_path):
    from keras_largebatch.train import data

    if data.find_fashion_mnist() is None:
        pytest.skip("Fashion-MNIST not installed (dataset-fashion-mnist)")
    proc = _command(f"--model_dir={tmp_path}/run", "--model=resnet_cifar",
                    "--resnet_depth=8", "--resnet_width=4",
                    "--dataset=fashion_mnist", "--global_batch_size=256",
                    "--gradient_accumulation_steps=2", "--epochs=1",
                    "--steps_per_epoch=4", "--optimizer=sgd")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_train"] == 60000
    assert summary["num_validation"] == 10000


def test_tfrecord_without_tensorflow_exits_2_naming_the_install(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-00000").write_bytes(b"")
    proc = _command(f"--model_dir={tmp_path}/run", "--dataset=tfrecord",
                    f"--data_dir={tmp_path}/data")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "pip install tensorflow-cpu" in proc.stderr
    assert not os.path.exists(tmp_path / "run")


def test_tf_data_pipeline_without_tensorflow_exits_2(tmp_path):
    proc = _command(f"--model_dir={tmp_path}/run",
                    "--input_pipeline=tf_data")
    assert proc.returncode == 2
    assert "pip install tensorflow-cpu" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
