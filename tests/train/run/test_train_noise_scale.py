"""`keras-largebatch-train --gradient_noise_scale`."""

import json
import math
import os

from keras_largebatch.train.run import driver as train_main

TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=16",
        "--steps_per_epoch=4", "--verbose=0", "--augment=none",
        "--warmup_epochs=0", "--image_size=67", "--epochs=2"]


def _run(*args):
    return train_main.main(["keras-largebatch-train", *args])


def test_without_two_batch_sizes_exits_2_naming_the_flag(small, tmp_path,
                                                        capsys):
    assert _run(*TINY, "--gradient_noise_scale",
                f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "gradient_noise_scale=True" in err
    assert "--gradient_accumulation_steps >= 2" in err
    assert not os.path.exists(tmp_path / "run")


def test_accumulation_logs_b_simple_and_a_closing_line(small, tmp_path,
                                                       capsys):
    assert _run(*TINY, "--gradient_noise_scale",
                "--gradient_accumulation_steps=2",
                f"--model_dir={tmp_path}/run") == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert math.isfinite(summary["gradient_noise_scale"])
    history = (tmp_path / "run" / "history.csv").read_text().splitlines()
    header = history[0].split(",")
    for key in ("gradient_noise_scale", "gns_grad_sq_norm", "gns_trace_cov"):
        assert key in header
    assert len(history) == 3
    assert "gradient noise scale" in out and "at batch 16" in out or (
        "not measured" in out), out
