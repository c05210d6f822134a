"""The `keras-largebatch-train` command.

`flags` (absl flags), `data` (embedded digits, class folders, TFRecords,
synthetic, keras.datasets), `augment` (Keras 3 preprocessing layers),
`recipe` (model, precision, learning rate, optimizer), `outputs`
(summary.json, learning curves, checkpoints, resume checks) and `main`
(`run()`, the console-script entry point).
"""
