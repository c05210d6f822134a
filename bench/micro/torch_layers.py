"""ResNet-50 forward+backward on torch: the package's layers, Keras' own,
plain `torch.nn`, and JAX, counted and timed in one run.

For ResNet-50 of `keras_largebatch.applications` (v1, 1000 classes) at
`--size`² (112), batch `--batch` (16), one forward and backward pass in
training mode on this machine's CPU: under torch's profiler, the aten ops,
the copies (`aten::copy_`, `clone`, `contiguous`, nested ones included)
split by what they copy — activations, parameters (the kernel into torch's
layout and its gradient back), 1-D statistics (the moving statistics'
writes) and scalars —, and the batch-norm kernels (`native_batch_norm`);
then the median time of `--repeats` passes, outside the profiler. The
arms: (a) the applications' layers (`keras_largebatch.layers`) on Keras'
torch backend, (b) the same model with Keras' stock layers
(`keras_largebatch.layers.to_stock`), (c) the same network written in plain
`torch.nn` with channels_last memory, (d) the applications on JAX (`jax.jit`
of the forward and backward pass, in a process of its own; time only).

    python -m bench.micro.torch_layers

Prints a Markdown table and writes `bench/results/torch_layers.json`.
"""

import argparse
import collections
import os
import statistics
import time

import bench
from bench import micro
from bench.core import provenance

COPIES = ("aten::copy_", "aten::clone", "aten::contiguous")
BATCH_NORM = "aten::native_batch_norm"
LABELS = {
    "ours": "keras_largebatch.layers, Keras torch backend",
    "stock": "Keras' stock layers, Keras torch backend",
    "torch": "plain torch.nn, channels_last",
    "jax": "keras_largebatch.layers, Keras JAX backend (jit)",
}


def count(profile, param_shapes, batch):
    """The profile's aten ops, copies by kind and batch-norm kernels."""
    events = [e for e in profile.events() if e.name.startswith("aten::")]
    names = collections.Counter(e.name for e in events)
    kinds = collections.Counter()
    for e in events:
        if e.name in COPIES:
            shape = tuple(e.input_shapes[0]) if e.input_shapes else ()
            kinds[copy_kind(shape, param_shapes, batch)] += 1
    return {"aten_ops": len(events),
            "copies": sum(names[n] for n in COPIES),
            "copies_by_op": {n: names[n] for n in COPIES},
            "copies_by_kind": dict(kinds),
            "batch_norm_kernels": names[BATCH_NORM]}


def copy_kind(shape, param_shapes, batch):
    """'activation', 'parameter', 'statistic' (1-D) or 'scalar'."""
    if len(shape) == 0:
        return "scalar"
    if sorted(shape) in param_shapes and not (
            len(shape) == 4 and shape[0] == batch):
        return "parameter"
    if len(shape) == 1:
        return "statistic"
    return "activation"


def profile_step(step, param_shapes, batch, repeats):
    """`count` of one `step()` (after a warm-up one), and its median
    seconds over `repeats` more, outside the profiler."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    step()
    with profile(activities=[ProfilerActivity.CPU],
                 record_shapes=True) as prof:
        step()
    result = count(prof, param_shapes, batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    result["median_s"] = statistics.median(times)
    result["torch_threads"] = torch.get_num_threads()
    return result


def keras_arm(stock, size, batch, repeats):
    import keras
    import numpy as np
    import torch

    from keras_largebatch.applications import ResNet50
    from keras_largebatch.layers import to_stock

    keras.utils.set_random_seed(0)
    model = ResNet50(input_shape=(size, size, 3))
    if stock:
        model = to_stock(model)
    x = torch.tensor(np.random.default_rng(0).uniform(
        -1, 1, (batch, size, size, 3)).astype("float32"))

    def step():
        for v in model.trainable_weights:
            v.value.grad = None
        model(x, training=True).sum().backward()

    shapes = [sorted(v.shape) for v in model.weights]
    return profile_step(step, shapes, batch, repeats)


def torch_resnet50(classes=1000):
    """ResNet-50 v1 (stride on the first 1x1, conv biases, BN epsilon
    1.001e-5, softmax), as `applications.ResNet50`, in plain `torch.nn`."""
    from torch import nn

    def bn(c):
        return nn.BatchNorm2d(c, eps=1.001e-5, momentum=0.01)

    class Block(nn.Module):
        def __init__(self, cin, filters, stride, project):
            super().__init__()
            self.shortcut = (nn.Sequential(
                nn.Conv2d(cin, 4 * filters, 1, stride), bn(4 * filters))
                if project else nn.Identity())
            self.body = nn.Sequential(
                nn.Conv2d(cin, filters, 1, stride), bn(filters), nn.ReLU(),
                nn.Conv2d(filters, filters, 3, 1, 1), bn(filters), nn.ReLU(),
                nn.Conv2d(filters, 4 * filters, 1), bn(4 * filters))

        def forward(self, x):
            return (self.shortcut(x) + self.body(x)).relu()

    stages, cin = [], 64
    for filters, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                    (512, 3, 2)):
        for i in range(blocks):
            stages.append(Block(cin, filters, stride if i == 0 else 1, i == 0))
            cin = 4 * filters
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3), bn(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(2048, classes), nn.Softmax(-1))


def torch_arm(size, batch, repeats):
    import torch

    torch.manual_seed(0)
    model = torch_resnet50().to(memory_format=torch.channels_last).train()
    x = torch.rand(batch, 3, size, size).mul(2).sub(1).contiguous(
        memory_format=torch.channels_last)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    shapes = [sorted(p.shape) for p in model.parameters()]
    return profile_step(step, shapes, batch, repeats)


def jax_arm(size, batch, repeats):
    """Median seconds of a jitted forward+backward on JAX (a child
    process: one backend per process)."""
    return micro.child("torch_layers", "jax", "--jax_child", "--size", size,
                       "--batch", batch, "--repeats", repeats)


def jax_child(size, batch, repeats):
    import jax
    import keras
    import numpy as np

    from keras_largebatch.applications import ResNet50

    keras.utils.set_random_seed(0)
    model = ResNet50(input_shape=(size, size, 3))
    x = np.random.default_rng(0).uniform(
        -1, 1, (batch, size, size, 3)).astype("float32")
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def loss(trainable, frozen):
        y, frozen = model.stateless_call(trainable, frozen, x, training=True)
        return y.sum(), frozen

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    jax.block_until_ready(step(trainable, frozen))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(trainable, frozen))
        times.append(time.perf_counter() - start)
    bench.say({"median_s": statistics.median(times), "jax": jax.__version__})


def main():
    p = micro.parser(__doc__, "torch_layers")
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--jax_child", action="store_true",
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.jax_child:
        return jax_child(args.size, args.batch, args.repeats)
    # Before anything imports Keras (keras_largebatch does).
    os.environ["KERAS_BACKEND"] = "torch"
    import keras

    load_before = os.getloadavg()
    rows = {
        "ours": keras_arm(False, args.size, args.batch, args.repeats),
        "stock": keras_arm(True, args.size, args.batch, args.repeats),
        "torch": torch_arm(args.size, args.batch, args.repeats),
        "jax": jax_arm(args.size, args.batch, args.repeats),
    }
    load_after = os.getloadavg()
    plain = rows["torch"]
    print(f"\nResNet-50 (keras_largebatch.applications, v1) forward+backward, "
          f"training mode, {args.size}x{args.size}, batch {args.batch}, "
          f"float32, {provenance.machine('torch')}\n")
    print("| arm | aten ops | vs plain torch | copies (activation / parameter "
          "/ statistic / scalar) | batch-norm kernels | median s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "aten_ops" not in r:
            print(f"| {LABELS[name]} | | | | | {r['median_s']:.3f} |")
            continue
        k = r["copies_by_kind"]
        kinds = " / ".join(str(k.get(n, 0)) for n in
                           ("activation", "parameter", "statistic", "scalar"))
        print(f"| {LABELS[name]} | {r['aten_ops']:,} | "
              f"{r['aten_ops'] / plain['aten_ops']:.2f}x | {r['copies']:,} "
              f"({kinds}) | {r['batch_norm_kernels']} | {r['median_s']:.3f} |")
    result = {
        "claim": "ResNet-50 forward+backward on torch: aten ops, copies, "
                 "batch-norm kernels and time of keras_largebatch.layers "
                 "against Keras' stock layers, plain torch.nn "
                 "(channels_last) and JAX, on this CPU",
        **micro.stamp("torch_layers", ["torch"]),
        "load_1_5_15_before": load_before,
        "load_1_5_15_after": load_after,
        "keras": keras.__version__,
        "torch": provenance.version("torch"),
        "args": dict(vars(args), out=os.path.relpath(args.out, bench.ROOT)),
        "labels": LABELS,
        "results": rows,
    }
    micro.write(args.out, result, indent=1)


if __name__ == "__main__":
    main()
