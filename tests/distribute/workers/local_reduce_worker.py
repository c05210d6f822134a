"""All-reduces a mixed set of tensors over two local CPU devices.

Prints one line `RESULT<json>`: for each compression (`none`, `fp16`) and
op (`SUM`, `MEAN`), the reduced values on each device, plus the inputs and
the buckets traced, through `reduce` of each value (as `strategy.reduce`)
under the keys `<compression>_<op>`, and through `batch_reduce` (as
`ReplicaContext.all_reduce`) under `<compression>_<op>_replica`. Run in its own process: it splits the CPU in two
logical devices, which must happen before TensorFlow initialises.
"""

import json

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

from tensorflow.python.distribute import cross_device_utils  # noqa: E402
from tensorflow.python.distribute import values  # noqa: E402

from keras_largebatch.distribute import FusedCollectiveAllReduce  # noqa: E402
from keras_largebatch.distribute import ReduceConfig  # noqa: E402

DEVICES = ["/device:CPU:0", "/device:CPU:1"]
SHAPES = [(3, 4), (5,), (), (0, 2), (7, 3), (4,)]
DTYPES = ["float32", "float16", "float32", "float32", "bfloat16", "int32"]


def inputs():
    rng = np.random.RandomState(0)
    per_device = []
    for d in range(len(DEVICES)):
        tensors = []
        for shape, dtype in zip(SHAPES, DTYPES):
            if dtype == "int32":
                tensors.append(np.arange(4, dtype="int32") * (d + 1))
            else:
                x = rng.normal(size=shape).astype("float32")
                # Exactly representable in every dtype used.
                tensors.append(np.round(x * 64) / 64)
        per_device.append(tensors)
    return per_device


def main():
    per_device = inputs()
    keys = cross_device_utils.CollectiveKeys()
    out = {"inputs": [[t.tolist() for t in ts] for ts in per_device]}
    for compression in (None, "fp16"):
        ops = FusedCollectiveAllReduce(
            DEVICES, 2, tf.distribute.experimental.CommunicationOptions(),
            keys,
            config=ReduceConfig(fusion_threshold_bytes=64,
                                compression=compression),
        )
        for op in (tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN):
            pairs = []
            for k, dtype in enumerate(DTYPES):
                parts = []
                for d, device in enumerate(DEVICES):
                    with tf.device(device):
                        parts.append(tf.constant(per_device[d][k], dtype))
                value = values.PerReplica(parts)
                pairs.append((value, value))

            @tf.function
            def reduce():
                return [
                    list(ops.reduce(op, value, value).values)
                    for value, _ in pairs
                ]

            @tf.function
            def replica_reduce():
                return [list(r.values) for r in ops.batch_reduce(op, pairs)]

            for suffix, fn in (("", reduce), ("_replica", replica_reduce)):
                result = fn()
                out[f"{compression}_{op.value}{suffix}"] = [
                    [np.asarray(tf.cast(v, tf.float64)).tolist() for v in r]
                    for r in result
                ]
                log = [b for b in ops.bucket_log if b.wire_bytes or b.tensors > 1]
                out[f"{compression}_buckets{suffix}"] = log
                ops.bucket_log.clear()
    print("RESULT" + json.dumps(out))


main()
