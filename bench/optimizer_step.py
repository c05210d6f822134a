"""Optimizer step time on ResNet-50's 214 variables: LARS, LARSMixed, SGD.

Each backend runs in its own process (Keras fixes the backend at import).
Per backend, the step is run the way that backend's trainer runs it:
TensorFlow `apply` inside `tf.function` (and with XLA), JAX a jitted
`stateless_apply` with donated buffers, torch eager `apply`. Also reports the
floor: a minimal jitted JAX LARS (norms, then one fused update) against a
minimal jitted JAX SGD; LARS must read every weight and gradient once more
for the norms, so no implementation gets below that ratio.

    python bench/optimizer_step.py                      # all three backends
    python bench/optimizer_step.py --backends jax --steps 30

Prints a Markdown table and writes bench/results/optimizer_step.json.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "optimizer_step.json")


def _median_ms(fn, steps, warmup=3, sync=lambda out: None):
    for _ in range(warmup):
        sync(fn())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure_backend(steps):
    import keras
    import numpy as np

    import keras_largebatch as klb

    backend = keras.backend.backend()
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    grads_np = [rng.normal(size=v.shape).astype("float32") * 1e-3 for v in variables]
    grads = [keras.ops.convert_to_tensor(g) for g in grads_np]
    results = {"variables": len(variables),
               "parameters": int(sum(np.prod(v.shape) for v in variables))}

    def make(name):
        if name == "SGD":
            return keras.optimizers.SGD(0.1, momentum=0.9)
        if name == "LARS":
            return klb.LARS(0.1, momentum=0.9, weight_decay=5e-5)
        return klb.LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)

    for name in ("SGD", "LARS", "LARSMixed"):
        optimizer = make(name)
        optimizer.build(variables)
        if backend == "tensorflow":
            import tensorflow as tf

            for label, jit in (("", False), ("_xla", True)):
                step = tf.function(lambda: optimizer.apply(grads, variables),
                                   jit_compile=jit)
                results[name + label] = _median_ms(step, steps)
        elif backend == "jax":
            import jax

            import jax.numpy as jnp

            step = jax.jit(optimizer.stateless_apply, donate_argnums=(0, 2))
            state = {"opt": [jnp.array(v.value) for v in optimizer.variables],
                     "vars": [jnp.array(v.value) for v in variables]}

            def run():
                new_vars, new_opt = step(state["opt"], grads, state["vars"])
                state["vars"], state["opt"] = new_vars, new_opt
                return new_vars

            results[name] = _median_ms(
                run, steps, sync=lambda out: jax.block_until_ready(out))
        else:
            results[name] = _median_ms(
                lambda: optimizer.apply(grads, variables), steps)
    if backend == "jax":
        results.update(_jax_floor(grads, variables, steps))
    return backend, results


def _jax_floor(grads, variables, steps):
    """Minimal jitted SGD and LARS in plain jax.numpy (no Keras)."""
    import jax
    import jax.numpy as jnp

    ws = [jnp.array(v.value) for v in variables]
    vs = [jnp.zeros_like(w) for w in ws]

    @jax.jit
    def sgd(ws, vs, gs):
        vs = [0.9 * v + 0.1 * g for v, g in zip(vs, gs)]
        return [w - v for w, v in zip(ws, vs)], vs

    @jax.jit
    def lars(ws, vs, gs):
        new_ws, new_vs = [], []
        for w, v, g in zip(ws, vs, gs):
            wn, gn = jnp.linalg.norm(w), jnp.linalg.norm(g)
            trust = jnp.where((wn > 0) & (gn > 0), 1e-3 * wn / (gn + 5e-5 * wn), 1.0)
            v = 0.9 * v + 0.1 * trust * (g + 5e-5 * w)
            new_ws.append(w - v)
            new_vs.append(v)
        return new_ws, new_vs

    out = {}
    for name, fn in (("floor_SGD", sgd), ("floor_LARS", lars)):
        out[name] = _median_ms(lambda: fn(ws, vs, grads), steps,
                               sync=jax.block_until_ready)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        backend, results = measure_backend(args.steps)
        print("RESULT " + json.dumps({backend: results}))
        return

    table = {}
    for backend in args.backends.split(","):
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--steps", str(args.steps)],
            env=env, capture_output=True, text=True, timeout=1800,
        )
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode or not lines:
            sys.exit(f"{backend} failed:\n{out.stderr[-3000:]}")
        table.update(json.loads(lines[-1][len("RESULT "):]))

    rows = []
    for backend, r in table.items():
        variants = [""] + (["_xla"] if backend == "tensorflow" else [])
        for v in variants:
            sgd, lars, mixed = r["SGD" + v], r["LARS" + v], r["LARSMixed" + v]
            rows.append((backend + (" (XLA)" if v else ""), sgd, lars, mixed,
                         lars / sgd, mixed / sgd))
        if "floor_SGD" in r:
            rows.append(("floor: minimal jitted JAX", r["floor_SGD"],
                         r["floor_LARS"], float("nan"),
                         r["floor_LARS"] / r["floor_SGD"], float("nan")))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"\nResNet-50 optimizer step, {machine}, median of {args.steps} steps (ms)\n")
    print("| backend | SGD(0.9) | LARS | LARSMixed | LARS/SGD | LARSMixed/SGD |")
    print("|---|---|---|---|---|---|")
    for name, sgd, lars, mixed, ratio, mixed_ratio in rows:
        print(f"| {name} | {sgd:.1f} | {lars:.1f} | {mixed:.1f} | "
              f"{ratio:.2f} | {mixed_ratio:.2f} |")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    from keras_largebatch._shared import atomic_write

    atomic_write(RESULTS, json.dumps(
        {"machine": machine, "steps": args.steps, "ms": table}, indent=2
    ))


if __name__ == "__main__":
    main()
