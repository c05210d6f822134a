"""Traces (never runs) train steps and reports how their collectives depend
on each other and on the gradients.

Prints one line `RESULT<json>`:

- `buckets`: the fusion buckets (variable indices) of a `LARSMixed` step
  of a 3-layer MLP under `MirroredStrategy` on two CPU devices with
  `FusedCollectiveAllReduce` (256-byte buckets);
- `depends`: for each all-reduce issued on device 0, in program order, the
  indices of the variables whose device-0 gradient it depends on;
- `chains`: for a hierarchical all-reduce (group of 4 in 2 nodes of two
  devices, this task the leader of node 0, three buckets), one list per
  device of `[op type, depends on the device's previous collective]` for
  every collective on it (intra-node, leaders', broadcast), in program
  order.

Run in its own process: it splits the CPU in two logical devices.
"""

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402

import keras_largebatch as klb  # noqa: E402
from keras_largebatch.distribute import all_reduce  # noqa: E402
from keras_largebatch.distribute.config import ReduceConfig  # noqa: E402

DEVICES = ["/device:CPU:0", "/device:CPU:1"]
COLLECTIVES = (
    "CollectiveReduceV2", "CollectiveBcastSendV2", "CollectiveBcastRecvV2"
)


def ancestors(op):
    """Names of the ops `op` depends on, through data or control edges."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(
            current.control_inputs
        ):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return seen


def collectives(graph, device_suffix):
    return [
        op for op in graph.get_operations()
        if op.type in COLLECTIVES and op.device.endswith(device_suffix)
    ]


def bucket_dependencies():
    options = tf.distribute.experimental.CommunicationOptions()
    cross_device_ops = all_reduce.FusedCollectiveAllReduce(
        DEVICES, 2, options, config=ReduceConfig(fusion_threshold_bytes=256)
    )
    strategy = tf.distribute.MirroredStrategy(
        DEVICES, cross_device_ops=cross_device_ops
    )
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3),
        ])
        optimizer = klb.LARSMixed(0.1)
        optimizer.build(model.trainable_variables)
    names = {}

    @tf.function
    def step(x):
        def fn(x):
            with tf.GradientTape() as tape:
                loss = optimizer.scale_loss(tf.reduce_sum(model(x) ** 2))
            grads = tape.gradient(loss, model.trainable_variables)
            if grads[0].device.endswith("CPU:0"):
                names.update({g.op.name: i for i, g in enumerate(grads)})
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(fn, args=(x,))

    graph = step.get_concrete_function(
        tf.TensorSpec([4, 8], tf.float32)
    ).graph
    depends = []
    for op in collectives(graph, "CPU:0"):
        up = ancestors(op)
        depends.append(sorted(i for name, i in names.items() if name in up))
    return [list(b) for b in cross_device_ops.bucket_log], depends


def hierarchy_chains():
    options = tf.distribute.experimental.CommunicationOptions()
    cross_device_ops = all_reduce.FusedCollectiveAllReduce(
        DEVICES, 4, options, task_id=0, node_of_task=(0, 1),
        config=ReduceConfig(fusion_threshold_bytes=64,
                            hierarchical_threshold_bytes=2**20),
    )

    @tf.function
    def reduce(a, b, c):
        return [
            cross_device_ops._all_reduce(
                tf.distribute.ReduceOp.SUM, [a * (d + 1), b, c], d, options
            )
            for d in range(len(DEVICES))
        ]

    spec = tf.TensorSpec([16], tf.float32)
    graph = reduce.get_concrete_function(spec, spec, spec).graph
    chains = []
    for device in ("CPU:0", "CPU:1"):
        ops = collectives(graph, device)
        chains.append([
            [op.type, i > 0 and ops[i - 1].name in ancestors(op)]
            for i, op in enumerate(ops)
        ])
    return chains


def main():
    buckets, depends = bucket_dependencies()
    chains = hierarchy_chains()
    print("RESULT" + json.dumps(
        {"buckets": buckets, "depends": depends, "chains": chains}
    ))


main()
