"""The GPU check's plan, in one place: its parts layers, compiled, a, b and
cuda as
task specs of bench's process pool (`bench/core/pool.py`), each `python -m
bench.gpu_campaign.tasks SPEC` on its backend, run one at a time by `python
-m bench.gpu_campaign` into its record: the plans `GPU_CHECK` and
`GPU_SMOKE` (tiny sizes, on a CPU, through the same code). Part c is a
study plan (`bench/study/plans.py`). What each part measures and its
targets: bench/README.md.
"""

from bench.core.plan import Plan

TASKS = "bench.gpu_campaign.tasks"
PARTS = ("layers", "compiled", "a", "b", "cuda")
# Part layers, first (issue #59): ResNet-50 of `keras_largebatch.layers`
# ("v1", `keras_largebatch.applications.ResNet50`) with LARSMixed at part
# a's settings, `fit` images/s on torch eager, torch compiled
# (`jit_compile=True`) and JAX; (backend, model, optimizer, jit_compile as
# `model.compile` takes it).
LAYERS_ITEMS = (("torch", "v1", "lars_mixed", "auto"),
                ("torch", "v1", "lars_mixed", True),
                ("jax", "v1", "lars_mixed", "auto"))
# Part a, (backend, model, optimizer), in order of value: the optimizer
# ratios on both backends, our models on JAX, then the rest. The
# optimizers: `OPTIMIZERS` in `bench/gpu_campaign/tasks.py`.
A_ITEMS = (
    ("jax", "keras", "lso_sgd"), ("jax", "keras", "lars_mixed"),
    ("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed"),
    ("jax", "v1", "lso_sgd"), ("jax", "v1.5", "lso_sgd"),
    ("jax", "v1-nobias", "lso_sgd"), ("jax", "v1.5-nobias", "lso_sgd"),
    ("jax", "keras", "lamb_mixed"), ("torch", "keras", "lamb_mixed"),
    ("torch", "v1", "lso_sgd"), ("torch", "v1.5", "lso_sgd"),
    ("torch", "v1-nobias", "lso_sgd"), ("torch", "v1.5-nobias", "lso_sgd"),
)
A_SETTINGS = dict(size=224, batch=256, steps=20, warmup=5,
                  precision="mixed_float16")
B_SETTINGS = dict(steps=20, optimizers=None)
B_BACKENDS = ("jax", "torch")
# The torch step Keras compiles (`jit_compile=True`, torch.compile), run
# before part a: stock against LARSMixed, each against eager torch and JAX;
# each at most `COMPILED_SECONDS`, torch.compile of ResNet-50 included.
COMPILED_ITEMS = (("torch", "keras", "lso_sgd"),
                  ("torch", "keras", "lars_mixed"))
COMPILED_SECONDS = 400
CUDA_ARCH = "sm_90"

# The smoke's layers items at ResNet-8: the eager ones. Its compiled one
# would be part compiled's smoke item run twice (the same model, optimizer
# and settings), torch.compile on a CPU each time.
SMOKE_LAYERS = tuple((backend, "cifar8", optimizer, jit_compile)
                     for backend, _, optimizer, jit_compile in LAYERS_ITEMS
                     if jit_compile is not True)
# The smoke's part a: each optimizer and backend once, at the package's
# ResNet-8 but for one item through Keras' ResNet-50 builder (on torch,
# whose eager step is the cheapest there): a ResNet-50 traced and compiled
# by JAX on a CPU costs more than the rest of the part.
SMOKE_A = (("jax", "cifar8", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "cifar8", "lars_mixed"), ("torch", "cifar8", "lamb_mixed"))
# torch.compile of a ResNet-50 takes minutes on a CPU: the smoke compiles
# the package's ResNet-8 through the same code.
SMOKE_COMPILED = (("torch", "cifar8", "lars_mixed"),)
SMOKE_A_SETTINGS = dict(size=32, batch=2, steps=2, warmup=1,
                        precision="mixed_float16")
# The smoke's part b on the package's ResNet-8's variables (Keras'
# ResNet-50's 25.6M parameters cost a JAX trace and compile of minutes).
SMOKE_B_SETTINGS = dict(steps=2, optimizers=["LSO(SGD)", "LARSMixed"],
                        model="cifar8", size=32)


def specs(smoke=False):
    """The check's tasks in order of value (layers, compiled, a, b, cuda);
    the smoke's (`smoke`): tiny sizes, on a CPU, through the same code."""
    a_settings = SMOKE_A_SETTINGS if smoke else A_SETTINGS
    layers = [dict(part="layers", module=TASKS, run_backend=backend,
                   model=model, optimizer=optimizer, settings=a_settings,
                   smoke=smoke, jit_compile=jit_compile,
                   **(dict(limit_seconds=COMPILED_SECONDS)
                      if jit_compile is True else {}))
              for backend, model, optimizer, jit_compile in (
                  SMOKE_LAYERS if smoke else LAYERS_ITEMS)]

    def a(part, items, **extra):
        return [dict(part=part, module=TASKS, run_backend=backend,
                     model=model, optimizer=optimizer, settings=a_settings,
                     smoke=smoke, **extra)
                for backend, model, optimizer in items]

    return tuple(
        layers
        + a("compiled", SMOKE_COMPILED if smoke else COMPILED_ITEMS,
          limit_seconds=COMPILED_SECONDS)
        + a("a", SMOKE_A if smoke else A_ITEMS)
        + [dict(part="b", module=TASKS, run_backend=backend,
                settings=SMOKE_B_SETTINGS if smoke else B_SETTINGS,
                smoke=smoke) for backend in B_BACKENDS]
        + [dict(part="cuda", module=TASKS, arch=CUDA_ARCH, smoke=smoke)])


GPU_CHECK = Plan("gpu_check", "gpu_campaign",
                 "The GPU check's parts layers, compiled, a, b and cuda",
                 specs())
GPU_SMOKE = Plan("gpu_smoke", "gpu_campaign_smoke",
                 "The GPU check's smoke: its tasks at tiny sizes",
                 specs(smoke=True))
