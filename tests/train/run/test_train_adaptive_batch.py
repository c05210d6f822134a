"""`keras-largebatch-train --adaptive_batch`: bad combinations, the batch
trajectory in the outputs, kill and resume, several JAX processes."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.train import config as train_config
from keras_largebatch.train.run import driver as train_main

BACKEND = keras.backend.backend()
# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(HERE, "small_command.py")
TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=16",
        "--gradient_accumulation_steps=2", "--steps_per_epoch=8",
        "--epochs=3", "--verbose=0", "--augment=none", "--warmup_epochs=0",
        "--optimizer=sgd"]
SCHEDULE = ["--adaptive_batch=schedule", "--batch_schedule=1:32,2:64"]


@pytest.mark.parametrize("flags, named", [
    (["--gradient_accumulation_steps=1", "--adaptive_batch=noise_scale",
      "--max_global_batch_size=64"], "gradient_accumulation_steps=1"),
    (["--adaptive_batch=noise_scale", "--max_global_batch_size=8"],
     "max_global_batch_size=8"),
    (["--adaptive_batch=noise_scale", "--max_global_batch_size=36"],
     "max_global_batch_size=36"),
    # From the first epoch 4 x 16: above 32.
    (["--adaptive_batch=noise_scale", "--max_global_batch_size=32"],
     "max_global_batch_size=32"),
    (["--adaptive_batch=noise_scale", "--adaptive_start_multiple=3"],
     "adaptive_start_multiple=3"),
    (SCHEDULE + ["--adaptive_start_multiple=2"], "adaptive_start_multiple=2"),
    (["--adaptive_start_multiple=4"], "adaptive_start_multiple=4"),
    (["--adaptive_batch=schedule"], "batch_schedule=''"),
    (["--adaptive_batch=schedule", "--batch_schedule=1:8,2:32"],
     "batch_schedule='1:8,2:32'"),
    (["--adaptive_batch=schedule", "--batch_schedule=2:32,1:64"],
     "batch_schedule='2:32,1:64'"),
    (["--adaptive_batch=schedule", "--batch_schedule=1:32,3:64"],
     "batch_schedule='1:32,3:64'"),
    (["--adaptive_batch=schedule", "--batch_schedule=one:32"],
     "batch_schedule='one:32'"),
    (["--adaptive_batch=schedule", "--batch_schedule=1:64",
      "--max_global_batch_size=32"], "batch_schedule='1:64'"),
    (["--max_global_batch_size=64"], "max_global_batch_size=64"),
    (["--batch_schedule=1:32"], "batch_schedule='1:32'"),
    (SCHEDULE + ["--noise_scale_multiple=2"], "noise_scale_multiple=2.0"),
    (["--adaptive_batch=noise_scale", "--max_global_batch_size=64",
      "--noise_scale_multiple=0"], "noise_scale_multiple=0.0"),
    (["--adaptive_batch=noise_scale", "--adaptive_anneal_fraction=1"],
     "adaptive_anneal_fraction=1.0"),
    (["--adaptive_batch=noise_scale", "--adaptive_anneal_multiple=3"],
     "adaptive_anneal_multiple=3"),
    (SCHEDULE + ["--adaptive_anneal_fraction=0.25"],
     "adaptive_anneal_fraction=0.25"),
    (["--adaptive_anneal_fraction=0.25"], "adaptive_anneal_fraction=0.25"),
])
def test_bad_adaptive_combinations_exit_2_with_one_line_and_write_nothing(
        flags, named, tmp_path, capsys):
    capsys.readouterr()
    code = train_main.main(["keras-largebatch-train", *TINY, *flags,
                            f"--model_dir={tmp_path}/run"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("keras-largebatch-train: error:") and "\n" not in err
    assert f"Received: {named}" in err, err
    assert not os.path.exists(tmp_path / "run")


def _command(model_dir, *extra, kill=None, env=None):
    env = dict(os.environ, **(env or {}))
    env.pop("KILL_AT_EPOCH_STEP", None)
    if kill:
        env["KILL_AT_EPOCH_STEP"] = kill
    return subprocess.run(
        [sys.executable, SCRIPT, *TINY, *extra, f"--model_dir={model_dir}"],
        env=env, capture_output=True, text=True, timeout=300)


def _weights(model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"))
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.skipif(BACKEND == "tensorflow",
                    reason="JAX and torch on a CPU (issue's matrix); the "
                           "TensorFlow strategy's test is in tests/distribute")
def test_killed_adaptive_run_resumes_at_its_batch_with_identical_weights(
        tmp_path):
    whole = _command(tmp_path / "whole", *SCHEDULE)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # Killed in epoch 1 (batch 32), after its first update.
    killed = _command(tmp_path / "resumed", *SCHEDULE, kill="1,2")
    assert killed.returncode == 9, killed.stderr[-3000:]
    resumed = _command(tmp_path / "resumed", *SCHEDULE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for a, b in zip(_weights(tmp_path / "whole"),
                    _weights(tmp_path / "resumed")):
        np.testing.assert_array_equal(a, b)
    for name in ("whole", "resumed"):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["batch_trajectory"] == [16, 32, 64]
        # 8 micro-batches an epoch: 4 updates of 2, 2 of 4, 1 of 8.
        assert summary["updates"] == 7
        assert summary["final_global_batch_size"] == 64
    assert "batch=16->32->64 updates=7" in resumed.stdout
    assert os.path.exists(tmp_path / "resumed" / "learning_curves.png")


@pytest.mark.multi_process
@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution on JAX")
def test_two_jax_processes_grow_the_batch_as_one_process(tmp_path):
    from keras_largebatch.distribute import localhost

    noise = ["--adaptive_batch=noise_scale", "--max_global_batch_size=128",
             "--distribution=data_parallel", "--epochs=4",
             "--collective_timeout_seconds=30"]

    def job(model_dir, processes, devices):
        port = localhost.free_ports(1)[0]
        procs = []
        for index in range(processes):
            env = dict(os.environ, KERAS_BACKEND="jax",
                       XLA_FLAGS="--xla_force_host_platform_device_count="
                                 f"{devices}")
            env.pop("KILL_AT_EPOCH_STEP", None)
            if processes > 1:
                env.update(
                    KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                    KERAS_DISTRIBUTION_NUM_PROCESSES=str(processes),
                    KERAS_DISTRIBUTION_PROCESS_ID=str(index))
            procs.append(subprocess.Popen(
                [sys.executable, SCRIPT, *TINY, *noise,
                 f"--model_dir={model_dir}"], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        try:
            return [(p.wait(timeout=300), p.stdout.read() + p.stderr.read())
                    for p in procs]
        finally:
            localhost.kill(procs)

    one = job(tmp_path / "one", 1, 2)
    assert one[0][0] == 0, one[0][1][-3000:]
    two = job(tmp_path / "two", 2, 1)
    for code, log in two:
        assert code == 0, log[-3000:]
    first, second = (json.loads((tmp_path / d / "summary.json").read_text())
                     for d in ("one", "two"))
    assert first["batch_trajectory"] == second["batch_trajectory"]
    assert first["updates"] == second["updates"]
    # Both processes printed the same trajectory in their closing lines.
    lines = [next(ln for ln in log.splitlines() if "val_accuracy=" in ln)
             for _, log in two]
    assert len({ln.split("batch=")[1].split(" wall")[0] for ln in lines}) == 1


def test_noise_scale_needs_only_the_small_batch_and_its_rate(tmp_path):
    # The defaults: from 4 x 16, up to 8 x 16.
    config = train_config.parse(["prog", *TINY, "--adaptive_batch=noise_scale",
                               f"--model_dir={tmp_path}/run"])
    adaptive = config.adaptive
    assert (adaptive.max_global_batch_size, adaptive.adaptive_start_multiple,
            adaptive.noise_scale_multiple) == (0, 0, 4.0)
    from keras_largebatch.train.run import callbacks as fit_callbacks

    callback, = fit_callbacks._adaptive_batch(adaptive, 8)
    assert (callback.start_multiple, callback.given_max_batch_size,
            callback.c, callback.learning_rate_rule) == (4, None, 4.0, "auto")
    from keras_largebatch.adaptive_batch import defaults

    assert (callback.anneal_fraction, callback.anneal_multiple) == (
        defaults.ANNEAL_FRACTION, defaults.ANNEAL_MULTIPLE)


@pytest.mark.parametrize("flags", [
    ["--adaptive_batch=noise_scale", "--max_global_batch_size=128",
     "--adaptive_anneal_fraction=0.25"],
    SCHEDULE,
])
def test_the_flags_check_the_settings_the_callback_is_given(flags, tmp_path,
                                                            monkeypatch):
    from keras_largebatch.adaptive_batch import batches
    from keras_largebatch.train.run import callbacks as fit_callbacks

    checked, check = [], batches.check_compiled
    monkeypatch.setattr(batches, "check_compiled", lambda settings, k0, *a: (
        checked.append((settings, k0)), check(settings, k0, *a))[1])
    config = train_config.parse(["prog", *TINY, *flags,
                               f"--model_dir={tmp_path}/run"])
    callback, = fit_callbacks._adaptive_batch(config.adaptive, 8)
    # One check, `AdaptiveBatch`'s own, on the settings it is given.
    assert checked == [(callback.settings, 2)]


@pytest.mark.parametrize("policy, fraction", [
    ("noise_scale", 0.0), ("schedule", None), ("none", None)])
def test_a_run_recorded_before_the_anneal_resumes_without_one(policy,
                                                              fraction):
    from keras_largebatch.adaptive_batch import defaults
    from keras_largebatch.train.config import migration

    old = {"adaptive_batch": policy, "adaptive_start_multiple": 0,
           "noise_scale_multiple": 4.0, "adaptive_learning_rate": "auto"}
    upgraded = migration.upgrade(old)
    # A growing policy: none; else the flag's default, which it must keep.
    assert upgraded["adaptive_anneal_fraction"] == (
        defaults.ANNEAL_FRACTION if fraction is None else fraction)
    assert upgraded["adaptive_anneal_multiple"] == defaults.ANNEAL_MULTIPLE
    assert migration.upgrade(dict(old, adaptive_anneal_fraction=0.5))[
        "adaptive_anneal_fraction"] == 0.5


# The adaptive batch's previous defaults, spelled out.
PREVIOUS = ["--noise_scale_multiple=1", "--adaptive_learning_rate=sqrt",
            "--adaptive_start_multiple=1"]
NOISE = ["--adaptive_batch=noise_scale", "--max_global_batch_size=64"]


def _as_recorded_before_the_defaults_changed(model_dir):
    path = model_dir / "run_config.json"
    config = json.loads(path.read_text())
    del config["adaptive_start_multiple"]
    config.update(noise_scale_multiple=1.0, adaptive_learning_rate="auto")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@pytest.mark.skipif(BACKEND == "tensorflow",
                    reason="one backend's processes suffice (JAX and torch)")
def test_a_run_recorded_before_the_defaults_resumes_with_its_decisions(
        tmp_path):
    whole = _command(tmp_path / "whole", *NOISE, *PREVIOUS)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = _command(tmp_path / "resumed", *NOISE, *PREVIOUS, kill="2,1")
    assert killed.returncode == 9, killed.stderr[-3000:]
    _as_recorded_before_the_defaults_changed(tmp_path / "resumed")
    # The command line of then: the defaults left out.
    resumed = _command(tmp_path / "resumed", *NOISE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for a, b in zip(_weights(tmp_path / "whole"),
                    _weights(tmp_path / "resumed")):
        np.testing.assert_array_equal(a, b)
    trajectories = [json.loads((tmp_path / d / "summary.json").read_text())[
        "batch_trajectory"] for d in ("whole", "resumed")]
    assert trajectories[0] == trajectories[1]
    assert trajectories[0][0] == 16  # today's defaults start at 64


def test_flag_choices_and_defaults_are_the_registries():
    from keras_largebatch.adaptive_batch import defaults
    from keras_largebatch.adaptive_batch import policies
    from keras_largebatch.adaptive_batch import rules
    from keras_largebatch.train import config as flags

    table = {flag.name: flag for flag in flags.TABLE}
    assert table["adaptive_batch"].values == ("none",) + tuple(
        policies.POLICIES)
    assert table["adaptive_learning_rate"].values == tuple(rules.RULES)
    assert table["adaptive_learning_rate"].default == \
        defaults.LEARNING_RATE_RULE
    assert table["noise_scale_multiple"].default == \
        defaults.NOISE_SCALE_MULTIPLE
    assert table["adaptive_anneal_fraction"].default == \
        defaults.ANNEAL_FRACTION
    assert table["adaptive_anneal_multiple"].default == \
        defaults.ANNEAL_MULTIPLE
