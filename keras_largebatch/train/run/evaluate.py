"""`--mode=eval`: the latest checkpoint of a run on its validation set.

    keras-largebatch-train --model_dir runs/default --mode=eval

Flags not given on the command line take the run's values (its
`run_config.json`, and `epochs_raised.json`: `config.load.resolve`), so
the model, data and preprocessing are the run's; flags that are given must
still agree with the run, as for resuming. Writes `model_dir/eval.json`:

    {"checkpoint": "checkpoints/epoch_006.keras", "epoch": 6,
     "val_accuracy": ..., "val_loss": ..., "top5_accuracy": ... (> 10
     classes), "num_validation": ..., "backend": ...,
     "precise_bn_batches": 0}

With `--precise_bn_batches=N` the checkpoint's batch-norm statistics are
first recomputed over N training batches of its last epoch.
"""

import os

from keras_largebatch._shared import write_json
from keras_largebatch.train import PROG
from keras_largebatch.train import layout
from keras_largebatch.train.data import grain_pipeline


def evaluate(run, model_dir, epochs, precise_bn_batches=0):
    """Evaluates the latest checkpoint in `model_dir` with the model and
    data of `run` (a `driver.Run`), batch-norm statistics first
    recomputed over `precise_bn_batches` batches (of its last epoch;
    `epochs` for final.keras); writes eval.json; returns 0."""
    import keras

    from keras_largebatch.train.checkpointing import epochs as checkpoints

    path = checkpoints.latest(model_dir)
    if path is None:
        raise ValueError(
            "`mode=eval` found no checkpoint in `model_dir` (checkpoints/ "
            f"or final.keras). Received: model_dir={model_dir!r}")
    checkpoints.weights_only(run.model).load_weights(path)
    count = precise_bn_batches
    if count:
        from keras_largebatch.precise_bn import recompute_batch_norm_statistics

        # final.keras has no epoch in its name: it is the last one.
        epoch = checkpoints.epoch_of(path) or epochs
        recompute_batch_norm_statistics(
            run.model, run.inputs.precise_bn_batches(epoch - 1), count)
    with grain_pipeline.no_end_of_input_warning():
        metrics = run.model.evaluate(run.inputs.validation, verbose=0,
                                     return_dict=True)
    result = {
        "checkpoint": os.path.relpath(path, model_dir),
        "epoch": checkpoints.epoch_of(path),
        "val_accuracy": float(metrics["accuracy"]),
        "val_loss": float(metrics["loss"]),
        "num_validation": run.spec.num_validation,
        "backend": keras.backend.backend(),
        # Batch-norm statistics: the checkpoint's moving averages (0), or
        # recomputed over this many training batches.
        "precise_bn_batches": count,
    }
    if "top5_accuracy" in metrics:
        result["top5_accuracy"] = float(metrics["top5_accuracy"])
    where = os.path.join(model_dir, layout.EVAL)
    write_json(where, result)
    print(f"{PROG}: val_accuracy={result['val_accuracy']:.4f} "
          f"({result['checkpoint']}) -> {where}")
    return 0
