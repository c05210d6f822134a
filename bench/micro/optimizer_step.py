"""Optimizer step time on ResNet-50's 214 variables: LARS, LAMB and their
mixed variants against their Keras baselines, each backend in a process of
its own, its step run as its trainer runs it, and the floors of plain
jitted JAX (`_jax_floor`). The method and the results: docs/benchmarks.md.

    python -m bench.micro.optimizer_step                      # all three backends
    python -m bench.micro.optimizer_step --backends jax --steps 30

Prints a Markdown table and writes bench/results/optimizer_step.json (or
`--out`).
"""

import argparse
import functools
import os
import statistics
import time

import bench
from bench import micro


def median_ms(fn, steps, warmup=3, sync=lambda out: None):
    """Median wall-clock and process CPU milliseconds (all threads) per
    step. On a loaded machine wall time measures the scheduler as much as
    the step; CPU time measures the work."""
    for _ in range(warmup):
        sync(fn())
    wall, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        sync(fn())
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)


# Each rule against its Keras baseline.
PAIRS = [("LARS", "SGD"), ("LARSMixed", "LSO(SGD)"), ("LAMB", "Adam"),
         ("LAMBMixed", "LSO(Adam)")]


def optimizers():
    """Name -> a function that makes the optimizer (the GPU check's part a
    makes its optimizers here too)."""
    import keras

    import keras_largebatch as klb

    lso = keras.optimizers.LossScaleOptimizer
    return {
        "SGD": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "LARS": lambda: klb.LARS(0.1, momentum=0.9, weight_decay=5e-5),
        "LSO(SGD)": lambda: lso(keras.optimizers.SGD(0.1, momentum=0.9)),
        "LARSMixed": lambda: klb.LARSMixed(0.1, momentum=0.9, weight_decay=5e-5),
        "Adam": lambda: keras.optimizers.Adam(1e-3),
        "LAMB": lambda: klb.LAMB(1e-3, weight_decay=1e-2),
        "LSO(Adam)": lambda: lso(keras.optimizers.Adam(1e-3)),
        "LAMBMixed": lambda: klb.LAMBMixed(1e-3, weight_decay=1e-2),
    }


def _store(results, name, measured):
    results[name], results[name + "_cpu"] = measured


def measure_backend(steps, only=None, model="keras", size=224):
    """Each optimizer's (`only`: those named) step on the variables of
    `bench.micro.applications.build_model(model, size)` (default Keras'
    ResNet-50 at 224), ms: (backend, results)."""
    import keras
    import numpy as np

    from bench.micro import applications

    backend = keras.backend.backend()
    model = applications.build_model(model, size)
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    grads_np = [rng.normal(size=v.shape).astype("float32") * 1e-3 for v in variables]
    plain = [keras.ops.convert_to_tensor(g) for g in grads_np]
    results = {"variables": len(variables),
               "parameters": int(sum(np.prod(v.shape) for v in variables))}

    lso = keras.optimizers.LossScaleOptimizer
    scaled = [keras.ops.convert_to_tensor(g * 2.0**15) for g in grads_np]

    for name, make in optimizers().items():
        if only and name not in only:
            continue
        optimizer = make()
        optimizer.build(variables)
        grads = scaled if isinstance(optimizer, lso) else plain
        if backend == "tensorflow":
            import tensorflow as tf

            for label, jit in (("", False), ("_xla", True)):
                step = tf.function(
                    lambda o=optimizer, g=grads: o.apply(g, variables),
                    jit_compile=jit)
                _store(results, name + label, median_ms(step, steps))
        elif backend == "jax":
            import jax.numpy as jnp

            # As Keras' JAX trainer: the state donated in the order the step
            # returns it, so each output reuses its own input's buffer (in
            # `stateless_apply`'s order XLA would copy every variable).
            def apply(trainable, opt_vars, grads, optimizer=optimizer):
                return optimizer.stateless_apply(opt_vars, grads, trainable)

            state = [[jnp.array(v.value) for v in variables],
                     [jnp.array(v.value) for v in optimizer.variables]]
            _store(results, name, _donated_ms(apply, state, grads, steps))
        else:
            import torch

            # On a GPU `apply` only queues kernels: wait for them.
            _store(results, name, median_ms(
                lambda: optimizer.apply(grads, variables), steps,
                sync=lambda out: torch.cuda.is_available()
                and torch.cuda.synchronize()))
    if backend == "jax" and not only:
        results.update(_jax_floor(plain, variables, steps))
    return backend, results


def _donated_ms(fn, state, grads, steps):
    """`median_ms` of `state[:] = fn(*state, grads)`, jitted with `state`
    (the weights and the optimizer's) donated."""
    import jax

    step = jax.jit(fn, donate_argnums=(0, 1))

    def run():
        state[:] = step(*state, grads)
        return state[0]

    return median_ms(run, steps, sync=jax.block_until_ready)


def _jax_floor(grads, variables, steps):
    """Minimal jitted SGD, LARS, Adam and LAMB in plain jax.numpy (no
    Keras), their state donated as Keras' trainer donates it."""
    import jax.numpy as jnp

    def sgd(ws, vs, gs):
        vs = [0.9 * v + 0.1 * g for v, g in zip(vs, gs)]
        return [w - v for w, v in zip(ws, vs)], vs

    def lars(ws, vs, gs):
        new_ws, new_vs = [], []
        for w, v, g in zip(ws, vs, gs):
            wn, gn = jnp.linalg.norm(w), jnp.linalg.norm(g)
            trust = jnp.where((wn > 0) & (gn > 0), 1e-3 * wn / (gn + 5e-5 * wn), 1.0)
            v = 0.9 * v + 0.1 * trust * (g + 5e-5 * w)
            new_ws.append(w - v)
            new_vs.append(v)
        return new_ws, new_vs

    def adam(ws, mvs, gs, layerwise=False):
        new_ws, new_mvs = [], []
        for w, (m, v), g in zip(ws, mvs, gs):
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            r = (m / 0.1) / (jnp.sqrt(v / 0.001) + 1e-7)
            if layerwise:  # LAMB: decay in r, then the trust ratio
                r = r + 1e-2 * w
                wn, rn = jnp.linalg.norm(w), jnp.linalg.norm(r)
                r = r * jnp.where((wn > 0) & (rn > 0), wn / rn, 1.0)
            new_ws.append(w - 1e-3 * r)
            new_mvs.append((m, v))
        return new_ws, new_mvs

    lamb = functools.partial(adam, layerwise=True)
    out = {}
    for name, fn, slots in (("floor_SGD", sgd, 1), ("floor_LARS", lars, 1),
                            ("floor_Adam", adam, 2), ("floor_LAMB", lamb, 2)):
        zeros = [jnp.zeros(v.shape, "float32") for v in variables]
        if slots == 2:
            zeros = [(z, jnp.zeros_like(z)) for z in zeros]
        state = [[jnp.array(v.value) for v in variables], zeros]
        _store(out, name, _donated_ms(fn, state, grads, steps))
    return out


def main():
    parser = micro.parser(__doc__, "optimizer_step")
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        backend, results = measure_backend(args.steps)
        return bench.say({backend: results})

    load_at_start = os.getloadavg()
    table = {}
    for backend in args.backends.split(","):
        table.update(micro.child("optimizer_step", backend, "--child",
                                 "--steps", args.steps, timeout=1800))

    names = [n for pair in PAIRS for n in pair]
    stamp = micro.stamp("optimizer_step", args.backends.split(","))
    machine = stamp["machine"]
    for clock, suffix in (("wall-clock", ""), ("process CPU", "_cpu")):
        print(f"\nResNet-50 optimizer step, {machine}, median of {args.steps} "
              f"steps, {clock} ms\n")
        print("| backend | " + " | ".join(names) + " | "
              + " | ".join(f"{a}/{b}" for a, b in PAIRS) + " |")
        print("|---" * (1 + len(names) + len(PAIRS)) + "|")
        for backend, r in table.items():
            for v in [""] + (["_xla"] if backend == "tensorflow" else []):
                ms = [r[n + v + suffix] for n in names]
                ratios = [r[a + v + suffix] / r[b + v + suffix] for a, b in PAIRS]
                print(f"| {backend}{' (XLA)' if v else ''} | "
                      + " | ".join(f"{x:.1f}" for x in ms) + " | "
                      + " | ".join(f"{x:.2f}" for x in ratios) + " |")
        for backend, r in table.items():
            for rule, base in (("LARS", "SGD"), ("LAMB", "Adam")):
                if f"floor_{rule}{suffix}" in r:
                    a, b = r[f"floor_{rule}{suffix}"], r[f"floor_{base}{suffix}"]
                    print(f"\nfloor, minimal jitted JAX {rule}/{base}: "
                          f"{a:.1f} / {b:.1f} ms = {a / b:.2f}")
    print(f"\nload average at start: {load_at_start}")
    print("GPU rows: no GPU available on this machine (not measured).")
    record = {
        **stamp,
        "load_average_at_start": load_at_start,
        "steps": args.steps,
        "ms": table,
        "gpu": "no GPU available",
    }
    micro.write(args.out, record)


if __name__ == "__main__":
    main()
