"""keras-largebatch-train end to end: bad input, outputs, resume, flags."""

import csv
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.train import cli
from keras_largebatch.train import data
from keras_largebatch.train.run import placement

BACKEND = keras.backend.backend()
TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=8",
        "--steps_per_epoch=2", "--verbose=0", "--augment=none",
        "--warmup_epochs=0"]
# The command building conftest's 1.5 k-parameter `small_model`, for the
# jobs in subprocesses that check placement and outputs, not the network.
SMALL_COMMAND = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "small_command.py")
SMALL = [*TINY, "--image_size=67"]


def _run(*args):
    return cli.main(["keras-largebatch-train", *args])


def _snapshot(folder):
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, folder)] = f.read()
    return files


@pytest.fixture
def old_run(tmp_path):
    """A model_dir holding an earlier run's files."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "summary.json").write_text('{"val_accuracy": 0.97}\n')
    (model_dir / "run_config.json").write_text(json.dumps({
        "model": "alexnet_bn", "dataset": "digits", "data_dir": None,
        "image_size": 67, "global_batch_size": 32,
        "optimizer": "lars_mixed", "num_classes": 10}))
    return model_dir


def _corrupt_dir(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(
                root / name / f"{i}.png")
    (root / "b" / "bad.png").write_bytes(b"\x89PNG\r\n garbage")
    return str(root)


def _other_architecture(tmp_path):
    other = keras.Sequential([keras.Input((67, 67, 3)),
                              keras.layers.Conv2D(2, 3, name="conv1")])
    path = str(tmp_path / "other.weights.h5")
    other.save_weights(path)
    return path


BAD_INPUTS = {
    "unknown_model": (lambda t: ["--model=vgg16"], "model"),
    "unknown_dataset": (lambda t: ["--dataset=imagenet21k"], "dataset"),
    "missing_directory": (
        lambda t: ["--dataset=directory", f"--data_dir={t}/nowhere"],
        "data_dir"),
    "corrupt_image": (
        lambda t: ["--dataset=directory", f"--data_dir={_corrupt_dir(t)}",
                   "--image_size=67"], "bad.png"),
    "init_weights_of_another_architecture": (
        lambda t: [f"--init_weights={_other_architecture(t)}"],
        "other.weights.h5"),
    "image_size_below_the_minimum": (
        lambda t: ["--image_size=32"], "at least 67"),
    "resume_with_another_model": (
        lambda t: ["--model=resnet50", "--image_size=32",
                   "--dataset=synthetic", "--num_classes=10"],
        "differs from the run"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_leaves_model_dir_alone(
        case, old_run, tmp_path, capsys):
    make_args, expected = BAD_INPUTS[case]
    args = make_args(tmp_path)
    before = _snapshot(old_run)
    capsys.readouterr()
    assert _run(*args, f"--model_dir={old_run}") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-largebatch-train: error:")
    assert "\n" not in err and expected in err
    assert _snapshot(old_run) == before


@pytest.mark.backend_independent
@pytest.mark.parametrize("flag, shown", [
    ("--global_batch_size=0", "`global_batch_size` must be an int >= 1"),
    ("--epochs=0", "`epochs` must be an int >= 1"),
    ("--steps_per_epoch=-1", "`steps_per_epoch` must be an int >= 0"),
    ("--keep_checkpoints=-1", "`keep_checkpoints` must be an int >= 0"),
    ("--resnet_depth=9", "`resnet_depth` must be 6n + 2"),
    ("--warmup_epochs=-0.5", "`warmup_epochs` must be a float >= 0"),
    ("--eta=0", "`eta` must be a float > 0"),
    ("--label_smoothing=1", "`label_smoothing` must be a float in [0, 1)"),
    ("--num_classes=1", "`num_classes` must be 0 (inferred) or 2 to 100,000"),
    ("--num_classes=100001",
     "`num_classes` must be 0 (inferred) or 2 to 100,000"),
])
def test_out_of_range_flag_exits_2_naming_it_and_its_value(
        flag, shown, tmp_path, capsys):
    capsys.readouterr()
    assert _run(*TINY, flag, f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err.strip()
    name, value = flag[2:].split("=")
    assert err.startswith("keras-largebatch-train: error:") and "\n" not in err
    assert shown in err and f"Received: {name}={value}" in err, err
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.backend_independent
def test_image_size_above_the_cap_exits_2_before_loading_anything(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "load_for",
                        lambda *args: pytest.fail("the data was loaded"))
    capsys.readouterr()
    assert _run(*TINY, "--image_size=5000", f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-largebatch-train: error:") and "\n" not in err
    assert "`image_size` must be at most 1024" in err, err
    assert "Received: image_size=5000" in err, err
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.backend_independent
@pytest.mark.parametrize("field, value, expected", [
    ("epochs", "3", "an int"),
    ("epochs", None, "an int"),
    ("global_batch_size", 32.0, "an int"),
    ("momentum", "0.9", "a float"),
    ("nesterov", 0, "true or false"),
    ("data_dir", 7, "a string or null"),
    ("model", "vgg16", "one of alexnet_bn, resnet50"),
])
def test_a_recorded_field_of_another_type_exits_2_naming_it(
        field, value, expected, old_run, capsys):
    recorded = json.loads((old_run / "run_config.json").read_text())
    (old_run / "run_config.json").write_text(
        json.dumps(dict(recorded, **{field: value})))
    before = _snapshot(old_run)
    capsys.readouterr()
    assert _run(*TINY, f"--model_dir={old_run}") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-largebatch-train: error:") and "\n" not in err
    assert f"`{field}` in {old_run}" in err and expected in err, err
    assert f"Received: {field}={value!r}" in err, err
    assert _snapshot(old_run) == before


def test_global_batch_not_divisible_by_replicas_exits_2(
        old_run, monkeypatch, capsys):
    monkeypatch.setattr(placement, "_distribution",
                        lambda flags: (None, 3, True, 0))
    before = _snapshot(old_run)
    assert _run("--global_batch_size=32", f"--model_dir={old_run}") == 2
    assert "divisible by the number of replicas (3)" in capsys.readouterr().err
    assert _snapshot(old_run) == before


@pytest.mark.backend_independent
def test_model_dir_under_a_file_exits_2_and_writes_nothing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _run(*TINY, f"--model_dir={blocker}/run") == 2
    assert "not a directory" in capsys.readouterr().err
    assert blocker.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file"]


def test_distribution_needs_its_backend(tmp_path, capsys):
    flag = {"jax": "--distribution=multi_worker",
            "tensorflow": "--distribution=data_parallel",
            "torch": "--distribution=data_parallel"}[BACKEND]
    assert _run(flag, *TINY, f"--model_dir={tmp_path}/run") == 2
    assert "backend" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")


def test_run_writes_outputs_and_resumes_instead_of_starting_over(tmp_path):
    model_dir = tmp_path / "runs" / "run"  # missing parents are created
    assert _run(*TINY, "--epochs=2", f"--model_dir={model_dir}") == 0
    summary = json.loads((model_dir / "summary.json").read_text())
    for key in ("model", "dataset", "global_batch_size", "epochs",
                "val_accuracy", "images_per_sec", "wall_seconds"):
        assert key in summary
    assert (summary["model"], summary["dataset"], summary["epochs"]) == (
        "alexnet_bn", "synthetic", 2)
    assert summary["epochs_run_now"] == 2 and summary["images_per_sec"] > 0
    png = (model_dir / "learning_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    ckpts = sorted(os.listdir(model_dir / "checkpoints"))
    assert ckpts == ["epoch_001.weights.h5", "epoch_002.keras"]
    assert os.path.samefile(model_dir / "final.keras",
                            model_dir / "checkpoints" / "epoch_002.keras")

    # Same flags again: restored at epoch 2, nothing left to train.
    assert _run(*TINY, "--epochs=2", f"--model_dir={model_dir}") == 0
    again = json.loads((model_dir / "summary.json").read_text())
    assert again["epochs_run_now"] == 0
    assert again["val_accuracy"] == pytest.approx(summary["val_accuracy"])
    assert again["wall_seconds"] == pytest.approx(
        summary["wall_seconds"] + again["wall_seconds_now"])

    # One more epoch continues from epoch 2, not from scratch.
    assert _run(*TINY, "--epochs=3", f"--model_dir={model_dir}") == 0
    more = json.loads((model_dir / "summary.json").read_text())
    assert more["epochs_run_now"] == 1
    with open(model_dir / "history.csv") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == [0, 1, 2]
    # The earlier final model is epoch 2's checkpoint now; epoch 3's is final.
    assert sorted(os.listdir(model_dir / "checkpoints")) == [
        "epoch_002.keras", "epoch_003.keras"]
    assert os.path.samefile(model_dir / "final.keras",
                            model_dir / "checkpoints" / "epoch_003.keras")


@pytest.mark.backend_independent
def test_default_flags_are_the_documented_default_run():
    assert _run("--model=nope", "--model_dir=x") == 2  # defines and parses
    from absl import flags as absl_flags

    flags = absl_flags.FLAGS
    flags.unparse_flags()
    flags(["prog"])
    assert (flags.model, flags.dataset, flags.global_batch_size,
            flags.optimizer, flags.epochs, flags.distribution) == (
        "alexnet_bn", "digits", 32, "lars_mixed", 6, "none")


def _subprocess(args, extra_env=None, timeout=600, small=False):
    """The command in a subprocess; `small`: building `small_model`."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, **(extra_env or {}))
    env.pop("TF_CONFIG", None)
    command = [SMALL_COMMAND] if small else [
        "-c", "from keras_largebatch.train.cli import run; run()"]
    return subprocess.run(
        [sys.executable, *command, *args],
        env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.backend_independent
def test_console_entry_point_exits_2_on_unknown_model(tmp_path):
    proc = _subprocess(["--model=vgg16", f"--model_dir={tmp_path}/run"])
    assert proc.returncode == 2
    assert "keras-largebatch-train: error:" in proc.stderr
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution on JAX")
def test_data_parallel_counts_devices_as_replicas(tmp_path):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = _subprocess(["--distribution=data_parallel", *SMALL,
                        "--global_batch_size=7",
                        f"--model_dir={tmp_path}/run"], env, small=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "divisible by the number of replicas (2)" in proc.stderr
    proc = _subprocess(["--distribution=data_parallel", *SMALL, "--epochs=1",
                        f"--model_dir={tmp_path}/run"], env, small=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["replicas"] == 2


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow strategy")
def test_multi_worker_flag_runs_under_the_strategy_alone(tmp_path):
    proc = _subprocess(["--distribution=multi_worker", *SMALL, "--epochs=1",
                        f"--model_dir={tmp_path}/run"], small=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["replicas"] == 1


STRATEGY_PROBE = """
import json, sys
from keras_largebatch import distribute
from keras_largebatch.train.run import driver as main

class Probe:
    def __init__(self, communication_options=None, **kwargs):
        from tensorflow.python.eager import context
        print("PROBE" + json.dumps(dict(
            kwargs, timeout=communication_options.timeout_seconds,
            runtime_started=context.context()._initialized)))
        raise ValueError("probe stops here")

distribute.MultiWorkerMirroredStrategy = Probe
sys.exit(main.main(["keras-largebatch-train"] + sys.argv[1:]))
"""


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow strategy")
def test_multi_worker_strategy_comes_first_and_takes_its_flags(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", STRATEGY_PROBE, "--distribution=multi_worker",
         "--fusion_threshold_bytes=1048576", "--compression=fp16",
         "--hierarchical_threshold_bytes=0", "--workers_per_node=2",
         "--collective_timeout_seconds=30", "--topk_density=0.05", *TINY,
         f"--model_dir={tmp_path}/run"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
    )
    assert proc.returncode == 2 and "probe stops here" in proc.stderr
    line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE")][0]
    assert json.loads(line[len("PROBE"):]) == {
        "fusion_threshold_bytes": 1048576, "compression": "fp16",
        "hierarchical_threshold_bytes": 0, "workers_per_node": 2,
        "topk_density": 0.05, "timeout": 30.0, "runtime_started": False,
    }
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow strategy")
@pytest.mark.parametrize("flag", [
    "--fusion_threshold_bytes=-1", "--hierarchical_threshold_bytes=-8",
    "--workers_per_node=-2", "--collective_timeout_seconds=-1",
    "--topk_density=0.0", "--topk_density=1.5",
])
def test_bad_multi_worker_flags_exit_2_naming_them(flag, tmp_path, capsys):
    assert _run("--distribution=multi_worker", flag, *TINY,
                f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err
    assert flag[2:].split("=")[0] + "=" + flag.split("=")[1] in err, err


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow strategy")
def test_two_workers_with_topk_keep_their_residuals_across_a_resume(tmp_path):
    from keras_largebatch.distribute import localhost

    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)

    def job(epochs):
        command = [sys.executable, SMALL_COMMAND,
                   "--distribution=multi_worker", "--compression=topk",
                   "--topk_density=0.05", "--collective_timeout_seconds=120",
                   *SMALL, f"--epochs={epochs}",
                   f"--model_dir={tmp_path}/run"]
        logs = [tmp_path / f"e{epochs}_{i}.log" for i in range(2)]
        codes = localhost.run([command, command], 300, logs=logs, env=env)
        for code, log in zip(codes, logs):
            assert code == 0, log.read_text()[-3000:]

    job(1)
    # Each worker keeps its own residuals beside its own backup.
    folders = [tmp_path / "run" / "backup" / "topk_residuals" / "worker_0",
               tmp_path / "run" / "worker_1" / "backup" / "topk_residuals"
               / "worker_1"]
    for folder in folders:
        assert (folder / "latest").read_text() == "epoch_001"
    job(2)  # resumes: raising --epochs trains on
    for folder in folders:
        assert (folder / "latest").read_text() == "epoch_002"
        assert not (folder / "epoch_001").exists()


@pytest.mark.backend_independent
def test_help_lists_every_flag_by_group_with_its_default(capsys):
    from keras_largebatch.train import config as train_flags

    assert _run("--help") == 0
    out = capsys.readouterr().out
    assert out.startswith("USAGE: keras-largebatch-train [flags]")
    assert "--helpfull" in out
    headings = [line.split(":")[0] for line in out.splitlines()
                if line and not line.startswith((" ", "USAGE", "The "))]
    assert headings == list(train_flags.GROUPS)
    for flag in train_flags.TABLE:
        line = next(x for x in out.splitlines()
                    if x.startswith(f"  --{flag.name} "))
        # Under its group's heading, with its default.
        above = out[:out.index(line)].rstrip().split("\n\n")[-1]
        assert above.startswith(flag.group + ":")
        default = "none" if flag.default in (None, "") else str(flag.default)
        assert f"(default: {default}" in line
    assert "  --optimizer (default: lars_mixed; one of lars_mixed, " in out
    assert _run("-h") == 0 and "--global_batch_size" in capsys.readouterr().out


@pytest.mark.backend_independent
def test_helpfull_keeps_absls_full_list():
    proc = _subprocess(["--helpfull"])
    assert "--flagfile" in proc.stdout and "--global_batch_size" in proc.stdout
