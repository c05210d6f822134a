"""`keras-largebatch-train` building a model without batch norm or dropout,
for `test_torch_data_parallel.py`:

    python -m torch.distributed.run --nproc_per_node=2 \
        tests/train/ddp_command.py --distribution=data_parallel ...

Under torch's DistributedDataParallel each process normalizes over its own
slice of the batch and draws its own dropout masks, so only a model with
neither trains as one process on the global batch does. With
`KILL_AT_EPOCH_STEP=E,S` process `KILL_RANK` (default 1) ends
(`os._exit(9)`, as a kill would) after step S of epoch E (both from 0).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import kill_switch  # noqa: E402

from keras_largebatch.train import cli  # noqa: E402
from keras_largebatch.train.recipe import models  # noqa: E402


def plain_model(model_name, image_size, num_classes, bn_momentum=None,
                channels=3, *args, **kwargs):
    """A convolution, a pooling and a classifier: no per-process state."""
    inputs = keras.Input((image_size, image_size, channels))
    x = keras.layers.Conv2D(8, 3, strides=4, name="conv1")(inputs)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax",
                                 name="predictions")(x)
    return keras.Model(inputs, outputs, name=model_name)


models.build_model = plain_model
if os.environ.get("RANK", "0") == os.environ.get("KILL_RANK", "1"):
    kill_switch.install()

if __name__ == "__main__":
    cli.run()
