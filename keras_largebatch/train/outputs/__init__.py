"""What a run leaves in `model_dir`, each file written atomically.

    summary.json            model, dataset, global_batch_size, epochs,
                            val_accuracy, images_per_sec, wall_seconds, ...
    learning_curves.png     loss and accuracy per epoch (train, validation)
    history.csv             one row per epoch, kept across resumed runs
    evals.csv               with --evals_per_epoch > 1: the validation
                            accuracy within each epoch (`WithinEpochEvals`)
    run_config.json         the flags of the first run (checked when resuming)
    epochs_raised.json      each later raise of --epochs
                            (see `checkpointing/resume.py`)
    checkpoints/, final.keras, backup/
                            the checkpoints (`checkpointing/`: the epoch
                            backup, within epochs, the epoch checkpoints
                            and the final model, which takes the data
                            set's own images: `exported.save_keras`)
    run.lock                the lock a running run holds, and who it is
                            (`checkpointing/lock.py`)
    tensorboard/            train/ and validation/ scalars per epoch: loss,
                            accuracy (top5_accuracy), learning_rate,
                            loss_scale, images_per_sec
    eval.json               written by --mode=eval (see `run/evaluate.py`)

Nothing is written before every input has been checked; each file is
written to a temporary name in the same folder and renamed over the old
one, so a failed run never leaves a half-written file.

`files` reads history.csv back and draws learning_curves.png,
`callbacks` report the run while it trains, `exported` writes every
`.keras` file (`save_keras`), `report` writes run_config.json,
summary.json and the closing line around `fit` (every JSON file through
`_shared.write_json`).
"""
