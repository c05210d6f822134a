"""The `keras-largebatch-train` command.

`flags` (the flag table), `data` (embedded digits, Fashion-MNIST,
keras.datasets, class folders, synthetic; the tf.data pipeline),
`imagenet` (TFRecords), `grain_data` (the pipeline without TensorFlow),
`augment` and `augment_numpy` (stateless augmentation in tf.data and in
NumPy), `recipe` (model, precision, learning rate, optimizer), `outputs`
(summary.json, learning curves, TensorBoard, the backup), `checkpoints`,
`resume`, `evaluate` (`--mode=eval`), `processes` (several JAX processes)
and `main` (`run()`, the console-script entry point).
"""
