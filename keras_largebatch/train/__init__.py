"""The `keras-largebatch-train` command.

`flags` (the flag table, the cross-flag rules, the frozen `RunConfig` of
typed groups), `main` (the driver: `run()`, the console-script entry
point, parses the command line once and assembles the run, handing each
builder the groups it reads), `builders` (devices, schedule,
model and optimizer, callbacks, the `Run`), `data` (loaders and formats
without TensorFlow, the tf.data and Grain pipelines behind one factory),
`imagenet` (TFRecords), `augment` and `augment_numpy` (one stage table,
in tf.data and in NumPy), `recipe` (sizes, precision, learning rate,
optimizer), `outputs` and `checkpoints` (callbacks and files), `report`
(run_config.json, summary.json, the closing line), `resume`, `evaluate`
(`--mode=eval`) and `processes` (several JAX processes).
"""

PROG = "keras-largebatch-train"
