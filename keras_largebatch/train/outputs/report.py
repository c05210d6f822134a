"""What a run writes around `fit`: run_config.json first; at its end the
final model, summary.json, learning_curves.png and the closing line.

summary.json:

    model, dataset, global_batch_size, epochs, epochs_run_now,
    val_accuracy (top5_accuracy above 10 classes), images_per_sec,
    images_timed, train_seconds_timed, wall_seconds (over every invocation
    on the model_dir), wall_seconds_now, image_size, optimizer,
    peak_learning_rate, lr_rule, warmup_epochs, precision, backend,
    replicas, num_train, num_validation (gradient_noise_scale with
    --gradient_noise_scale or --adaptive_batch; with --adaptive_batch,
    batch_trajectory: the update batch of each epoch, updates: the
    optimizer updates taken, final_global_batch_size)
"""

import functools
import json
import math
import os
import time

from keras_largebatch._shared import check_int
from keras_largebatch._shared import write_json
from keras_largebatch.train import PROG
from keras_largebatch.train import checkpointing
from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import resume
from keras_largebatch.train.outputs import exported
from keras_largebatch.train.outputs import files


def begin(run, out_dir):
    """Writes run_config.json (a new run) or records a raise of `--epochs`
    (saying so), on the chief; a resumed run says where it resumes
    (`resumed from epoch E, step S`: E counted from 1, S updates into
    it)."""
    if run.resuming and run.initial_epoch < run.resuming.epochs:
        within = run.resuming.within_epoch
        print(f"{PROG}: resumed from epoch "
              f"{(within.epoch if within else run.initial_epoch) + 1}, "
              f"step {within.step if within else 0}")
    if not run.devices.chief:
        return
    if not run.resuming:
        write_json(os.path.join(out_dir, layout.RUN_CONFIG), run.recorded)
    elif run.resuming.raised:
        print(f"{PROG}: {run.schedule.raise_message}")
        resume.record_raise(out_dir, run.resuming,
                            run.schedule.raise_message)


def finish(config, run, out_dir, history, val_metrics, throughput, start):
    """Saves the final model of `run`; on the chief writes summary.json and
    learning_curves.png; prints the closing line. Returns 0.

    The summary names the run, so it reads several parts of `config` (a
    `config.RunConfig`): network, data, training, optimization,
    learning_rate, adaptive, and runtime's `keep_checkpoints`.
    """
    checkpointing.save_final(
        functools.partial(exported.save_keras, run.model, run.spec),
        os.path.join(out_dir, layout.CHECKPOINTS), out_dir,
        run.initial_epoch + len(history.epoch),
        config.runtime.keep_checkpoints)
    summary_path = os.path.join(out_dir, layout.SUMMARY)
    previous = {}
    if run.resuming and os.path.exists(summary_path):
        with open(summary_path, "rb") as f:
            try:  # A damaged one is rewritten.
                previous = json.loads(f.read().decode("utf-8"))
            except ValueError:
                pass
        if not isinstance(previous, dict):
            previous = {}
    wall_now = time.perf_counter() - start
    logs = files.read_history(out_dir, history)
    summary = summarize(config, run, history, val_metrics, throughput,
                        previous, wall_now, logs)
    if "gradient_noise_scale" in summary:
        print(f"{PROG}: " + describe(
            summary["gradient_noise_scale"],
            summary.get("final_global_batch_size",
                        config.training.global_batch_size)))
    if run.devices.chief:
        files.plot_learning_curves(
            logs,
            os.path.join(out_dir, layout.CURVES),
            f"{config.network.model} on {config.data.dataset}, batch "
            f"{config.training.global_batch_size}, "
            f"{config.optimization.optimizer}")
        write_json(summary_path, summary)
    where = summary_path if run.devices.chief else (
        "(not the chief: no summary)")
    grown = ""
    if "batch_trajectory" in summary:
        grown = (f"batch={_trajectory(summary['batch_trajectory'])} "
                 f"updates={summary['updates']} ")
    rate = summary["images_per_sec"]
    print(f"{PROG}: val_accuracy={summary['val_accuracy']:.4f} "
          f"images_per_sec={'n/a' if rate is None else f'{rate:.1f}'} "
          f"{grown}wall_seconds={wall_now:.1f} -> {where}")
    return 0


def _trajectory(batches):
    """`128->256->1024`: each batch the run took, in order."""
    steps = [int(b) for i, b in enumerate(batches)
             if i == 0 or b != batches[i - 1]]
    return "->".join(str(b) for b in steps)


def summarize(config, run, history, val_metrics, throughput, previous,
              wall_now, logs=None):
    """The summary.json of `run` and its `config` (`previous`: the one a
    resumed run left, whose wall time it adds to and whose rate it keeps
    when this invocation timed nothing; `logs`: every epoch's logs,
    resumed ones included, default this invocation's)."""
    import keras

    training, optimizer = config.training, config.optimization.optimizer
    images_timed, seconds_timed = throughput.timed()
    images_per_sec = throughput.images_per_sec()
    if images_per_sec is None:
        images_per_sec = previous.get("images_per_sec")
    summary = {
        "model": config.network.model,
        "dataset": config.data.dataset,
        "global_batch_size": training.global_batch_size,
        "epochs": training.epochs,
        "epochs_run_now": len(history.epoch),
        "val_accuracy": float(val_metrics["accuracy"]),
        "images_per_sec": images_per_sec,
        # What images_per_sec divides (this process's steps after the
        # one that compiled).
        "images_timed": images_timed,
        "train_seconds_timed": seconds_timed,
        # Over every invocation on this model_dir (resumed runs add up).
        "wall_seconds": previous.get("wall_seconds", 0.0) + wall_now,
        "wall_seconds_now": wall_now,
        "image_size": run.spec.image_size,
        "optimizer": optimizer,
        "peak_learning_rate": run.schedule.peak,
        "lr_rule": run.schedule.rule,
        "warmup_epochs": run.schedule.warmup_epochs,
        "precision": run.precision,
        "backend": keras.backend.backend(),
        "replicas": run.devices.replicas,
        "num_train": run.spec.num_train,
        "num_validation": run.spec.num_validation,
    }
    if "top5_accuracy" in val_metrics:
        summary["top5_accuracy"] = float(val_metrics["top5_accuracy"])
    noise = history.history.get("gradient_noise_scale")
    if noise:
        summary["gradient_noise_scale"] = float(noise[-1])
    if config.adaptive.adaptive_batch != "none" and history.epoch:
        batches = (logs or history.history)["global_batch_size"]
        summary["batch_trajectory"] = [int(b) for b in batches]
        summary["final_global_batch_size"] = int(batches[-1])
        summary["updates"] = int(history.history["updates"][-1])
    return summary


def describe(b_simple, batch_size):
    """One line: the measured B_simple and what it means for `batch_size`.

    With B_crit ~ B_simple, `S/S_min = 1 + B_crit/B` and
    `E/E_min = 1 + B/B_crit` (McCandlish et al., 2018, arXiv:1812.06162).
    """
    check_int("batch_size", batch_size, 1)
    if not (isinstance(b_simple, (int, float)) and math.isfinite(b_simple)
            and b_simple > 0):
        return (f"gradient noise scale: not measured (B_simple={b_simple}): "
                "the estimate of |G|^2 is not positive yet (the gradients "
                "are mostly noise at this batch, or the run is too short)")
    steps = 1 + b_simple / batch_size
    examples = 1 + batch_size / b_simple
    doubled = (1 + b_simple / (2 * batch_size)) / steps
    if batch_size <= b_simple / 2:
        verdict = "room to grow: a bigger batch still cuts steps nearly " \
                  "in proportion"
    elif batch_size < 2 * b_simple:
        verdict = "near the critical batch: a bigger batch trades " \
                  "examples for steps about evenly"
    else:
        verdict = "above the critical batch: extra examples are mostly " \
                  "wasted"
    return (f"gradient noise scale B_simple={b_simple:.0f} at batch "
            f"{batch_size}: steps {steps:.2f}x the minimum, examples "
            f"{examples:.2f}x (S/S_min = 1 + B_crit/B, B_crit ~ B_simple); "
            f"doubling the batch takes {doubled:.0%} of the steps; {verdict}")
