"""The `keras-largebatch-train` command.

`flag_table` (the one flag table), `flag_rules` (the cross-flag rules),
`run_config` (the frozen `RunConfig` of typed groups, written out),
`flag_parsing`, `flag_help` and `batch_schedule` (`flags` hands their names
on), `cli` (the console-script entry point: `--help` and the backend check
before Keras is imported), `main` (the driver: parses the command line once
and assembles the run, handing each builder the groups it reads),
`divergence` (a diverged run stops, exit code 3), `builders` (devices, schedule,
model and optimizer, callbacks, the `Run`), `data` (loaders and formats
without TensorFlow, the tf.data and Grain pipelines behind one factory),
`imagenet` (TFRecords), `augment` and `augment_numpy` (one stage table,
in tf.data and in NumPy), `recipe` (sizes, precision, learning rate,
optimizer), `outputs` (callbacks and files; every `.keras` file through
`save_keras`), `exported` (the saved model takes the data set's own
images), `banner` (what a run says before it trains), `interrupt` (Ctrl-C:
one line, exit code 130), `checkpointing` (the checkpoints: names, the
lock on the run folder, the atomic save, the epoch backup, within epochs,
the epoch checkpoints, which one a resume loads, the resume's flag rules),
`report` (run_config.json, summary.json, the closing line), `evaluate`
(`--mode=eval`) and `processes` (several JAX processes).
"""

PROG = "keras-largebatch-train"

# Ctrl-C: 128 + SIGINT, as a shell reports it (`run/interrupt.py`).
INTERRUPTED = 130
