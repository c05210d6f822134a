"""One process of `test_torch_ddp.py`: LARSMixed fits a small regression
under `torchrun` (gloo), each of the WORLD_SIZE processes on its slice of
every global batch, or alone on the whole batches when WORLD_SIZE is unset.
Writes the weights and the loss scale to OUT/rank<RANK>.npz.

Usage: python torch_ddp_fit.py OUT
"""

import os
import sys

import numpy as np

GLOBAL_BATCH = 16
STEPS = 4
# An infinite input in the second global batch, on the last process's
# slice: its loss-scaled gradients are non-finite, and every process must
# skip that step and halve the loss scale as one process would.
BAD_ROW = GLOBAL_BATCH + GLOBAL_BATCH - 1


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
    x[BAD_ROW, 0] = np.inf
    return x, y


def main(out):
    import torch

    count = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if count > 1:
        torch.distributed.init_process_group("gloo")
    import keras

    import keras_largebatch as klb

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = klb.LARSMixed(0.5, momentum=0.9, weight_decay=1e-3,
                              initial_scale=2.0**10)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = data()
    per_process = GLOBAL_BATCH // count
    rows = np.concatenate([
        np.arange(s * GLOBAL_BATCH + rank * per_process,
                  s * GLOBAL_BATCH + (rank + 1) * per_process)
        for s in range(STEPS)])
    model.fit(x[rows], y[rows], batch_size=per_process, epochs=1,
              shuffle=False, verbose=0)
    arrays = {f"w{i}": keras.ops.convert_to_numpy(w)
              for i, w in enumerate(model.weights)}
    arrays["scale"] = keras.ops.convert_to_numpy(optimizer.dynamic_scale)
    arrays["iterations"] = keras.ops.convert_to_numpy(optimizer.iterations)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)
    if count > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
