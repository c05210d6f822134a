"""One process of `test_layers_torch_ddp.py`: a ResNetCIFAR of
`keras_largebatch.layers` takes one SGD step under torch's
DistributedDataParallel (gloo, `torchrun`), each of the WORLD_SIZE
processes on its slice of the global batch; alone (WORLD_SIZE unset), the
gradient of each slice separately and their mean. Writes the gradients,
the weights after the step and the moving statistics to
OUT/rank<RANK>.npz (alone: OUT/alone.npz, with the slices' gradients).

Usage: python torch_ddp_step.py OUT
"""

import os
import sys

import numpy as np

GLOBAL_BATCH = 8
SLICES = 2


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH, 8, 8, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, GLOBAL_BATCH)]
    return x, y


def gradients(module, model, x, y):
    import keras
    import torch

    for v in model.trainable_variables:
        v.value.grad = None
    predictions = module(torch.tensor(x), training=True)
    loss = keras.ops.mean(keras.losses.categorical_crossentropy(
        torch.tensor(y), predictions))
    loss.backward()
    return [v.value.grad.clone() for v in model.trainable_variables]


def main(out):
    import torch

    count = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if count > 1:
        torch.distributed.init_process_group("gloo")
    import keras

    from keras_largebatch import layers
    from keras_largebatch.applications import ResNetCIFAR

    keras.utils.set_random_seed(1)
    model = ResNetCIFAR(depth=8, width=4, input_shape=(8, 8, 3), classes=3)
    assert type(model.get_layer("conv1_conv")) is layers.Conv2D
    x, y = data()
    per = GLOBAL_BATCH // SLICES
    arrays = {}
    if count > 1:
        module = torch.nn.parallel.DistributedDataParallel(model)
        rows = slice(rank * per, (rank + 1) * per)
        grads = gradients(module, model, x[rows], y[rows])
        name = f"rank{rank}"
    else:
        per_slice = []
        for s in range(SLICES):
            rows = slice(s * per, (s + 1) * per)
            per_slice.append(gradients(model, model, x[rows], y[rows]))
            for i, g in enumerate(per_slice[-1]):
                arrays[f"slice{s}_g{i}"] = g.numpy()
        grads = [sum(gs) / SLICES for gs in zip(*per_slice)]
        name = "alone"
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.apply(grads, model.trainable_variables)
    arrays.update({f"g{i}": g.numpy() for i, g in enumerate(grads)})
    arrays.update({f"w{i}": keras.ops.convert_to_numpy(v)
                   for i, v in enumerate(model.trainable_variables)})
    arrays.update({f"m{i}": keras.ops.convert_to_numpy(v)
                   for i, v in enumerate(model.non_trainable_variables)})
    np.savez(os.path.join(out, f"{name}.npz"), **arrays)
    if count > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
