"""The GPU check's tasks, each in a process of its own that the runner
starts (`bench/core/pool.py`): `python -m bench.gpu_campaign.tasks SPEC`
runs a spec of `bench/gpu_campaign/plan.py` on its backend (Keras fixes it at
import) and prints `RESULT <json>`. Parts layers, a, compiled and b exit
`pool.NO_GPU` instead where the device is a CPU and the spec is not the
smoke's; part cuda builds and runs the fusion kernels' device test, and
fails where it does.
"""

import json
import os
import shutil
import subprocess
import sys

import bench
from bench import ROOT

# Part a's optimizers: the name a result records, and the optimizer's in
# `bench/micro/optimizer_step.py`'s `optimizers()`, which makes it.
OPTIMIZERS = {
    "lso_sgd": ("LossScaleOptimizer(SGD(0.1, momentum=0.9))", "LSO(SGD)"),
    "lars_mixed": ("LARSMixed(0.1, momentum=0.9, weight_decay=5e-5)",
                   "LARSMixed"),
    "lamb_mixed": ("LAMBMixed(1e-3, weight_decay=1e-2)", "LAMBMixed"),
}


def train_images_per_s(spec):
    """Parts layers, a and compiled: a model's training images/s with an
    optimizer (part compiled: the step Keras compiles with
    `jit_compile=True`; part layers: the spec's `jit_compile`)."""
    import keras

    from bench.micro import applications as apps
    from bench.micro import optimizer_step

    s = spec["settings"]
    keras.backend.clear_session()
    keras.config.set_dtype_policy(s["precision"])
    model = apps.build_model(spec["model"], s["size"])
    label, name = OPTIMIZERS[spec["optimizer"]]
    optimizer = optimizer_step.optimizers()[name]()
    result = apps.fit_images_per_s(
        model, optimizer, s["batch"], s["size"], s["steps"], s["warmup"],
        jit_compile=True if spec["part"] == "compiled" else spec.get(
            "jit_compile", "auto"))
    keras.config.set_dtype_policy("float32")
    return dict(result, model=apps.LABELS[spec["model"]], optimizer=label)


def optimizer_step_ms(spec):
    """Part b: each optimizer's step, ms."""
    from bench.micro import optimizer_step

    s = spec["settings"]
    _, ms = optimizer_step.measure_backend(
        s["steps"], s["optimizers"], **({"model": s["model"], "size": s["size"]}
                                        if "model" in s else {}))
    return ms


def device_test(spec):
    """Part cuda: the device test's command, status and last line (the
    smoke compiles it only, where nvcc and the Eigen headers are; else it
    is skipped), and its exit status."""
    eigen = spec.get("eigen") or os.path.join(ROOT, ".gpu_campaign",
                                              "eigen.tar.gz")
    if spec["smoke"] and not (os.path.exists(eigen) and shutil.which("nvcc")):
        print(f"cuda: skipped in the smoke run (needs nvcc and {eigen}: "
              "python -m bench.gpu_campaign --prepare)", file=sys.stderr)
        return dict(skipped=True), 0
    cmd = ["bash", os.path.join(ROOT, "native", "tests", "device_test.sh"),
           "--eigen-tar", eigen, "--arch", spec["arch"]]
    cmd += ["--out", spec["out"]] if spec.get("out") else []
    cmd += ["--compile-only"] if spec["smoke"] else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    print(f"device_test.sh: exit {proc.returncode}", *lines, sep="\n",
          file=sys.stderr)
    shown = [os.path.relpath(c, ROOT) if os.path.isabs(c) else c for c in cmd]
    return dict(command=" ".join(shown), returncode=proc.returncode,
                summary=lines[-1] if lines else "", passed=True,
                compile_only=spec["smoke"]), proc.returncode


def main(argv=None):
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    if spec["part"] == "cuda":
        result, status = device_test(spec)
        if status:
            return 1  # Its statuses (3: a CUDA error) are not the runner's.
        bench.say(result)
        return 0
    import keras

    from bench.micro import applications
    from bench.core.pool import NO_GPU

    backend = keras.backend.backend()
    device = applications.device_name(backend)
    if not spec["smoke"] and device.startswith("cpu"):
        print(f"{backend} sees no GPU ({device})", file=sys.stderr)
        return NO_GPU
    measure = optimizer_step_ms if spec["part"] == "b" else train_images_per_s
    bench.say(dict(measure(spec), backend=backend, device=device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
