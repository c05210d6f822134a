"""Everything GPU-bound, in one resumable command of a few minutes.

Parts, in order of value: compiled (the torch step `jit_compile=True`
compiles), a (ResNet-50 training images/s), b (optimizer-step times), cuda
(the fusion kernels' device test) and c (a study plan run by the study's
runner). Each finished item is kept in `<out>.json` and skipped by a rerun.
The parts, the files, how to prepare, run and rehearse it: bench/README.md.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys

# The plans import the package, hence Keras: on JAX (this machine may have
# no TensorFlow), as `main` has it.
os.environ.setdefault("KERAS_BACKEND", "jax")
from bench import ROOT  # noqa: E402
from bench.gpu_campaign.campaign import Campaign, Deadline, child  # noqa: E402
from bench.gpu_campaign.report import markdown  # noqa: E402
from bench.study import plans  # noqa: E402
from bench.study import runner as study_runner  # noqa: E402

RESULTS = os.path.join(study_runner.RESULTS, "gpu_campaign")
PARTS = ("compiled", "a", "b", "cuda", "c")
# Part a, (backend, model, optimizer), in order of value: the optimizer
# ratios on both backends, our models on JAX, then the rest.
A_ITEMS = [
    ("jax", "keras", "lso_sgd"), ("jax", "keras", "lars_mixed"),
    ("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed"),
    ("jax", "v1", "lso_sgd"), ("jax", "v1.5", "lso_sgd"),
    ("jax", "v1-nobias", "lso_sgd"), ("jax", "v1.5-nobias", "lso_sgd"),
    ("jax", "keras", "lamb_mixed"), ("torch", "keras", "lamb_mixed"),
    ("torch", "v1", "lso_sgd"), ("torch", "v1.5", "lso_sgd"),
    ("torch", "v1-nobias", "lso_sgd"), ("torch", "v1.5-nobias", "lso_sgd"),
]
A_SETTINGS = dict(size=224, batch=256, steps=20, warmup=5,
                  precision="mixed_float16")
B_SETTINGS = dict(steps=20, optimizers=None)
B_BACKENDS = ("jax", "torch")
# The torch step Keras compiles (`jit_compile=True`, torch.compile), run
# before part a: stock against LARSMixed, each against eager torch and JAX.
COMPILED_ITEMS = [("torch", "keras", "lso_sgd"), ("torch", "keras", "lars_mixed")]
SMOKE_A = [("jax", "keras", "lso_sgd"), ("torch", "keras", "lso_sgd"),
           ("torch", "keras", "lars_mixed"), ("torch", "v1", "lamb_mixed")]
# torch.compile of a ResNet-50 takes minutes on a CPU: the smoke compiles
# the package's ResNet-8 through the same code.
SMOKE_COMPILED = [("torch", "cifar8", "lars_mixed")]
SMOKE = dict(
    a=dict(size=32, batch=2, steps=2, warmup=1, precision="mixed_float16"),
    b=dict(steps=2, optimizers=["LSO(SGD)", "LARSMixed"]),
)
PREPARED_LIMIT_MIB = 50  # --prepare's folder: a call carries 64 MiB

# Keras, Grain and what they need beyond the GPU image's Python packages as
# `bench/gpu_campaign/rehearsal.sh` rehearses them (jax, numpy, optax,
# absl-py, h5py, ml-dtypes, rich, matplotlib, tensorboard and its protobuf;
# the image also has torch, scikit-learn and Pillow).
WHEELS = ["keras", "namex", "optree", "grain", "array-record", "portpicker",
          "tensorboardX", "etils", "fsspec", "zipp", "cloudpickle", "psutil"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS),
                   help="comma-separated parts to run, in order: "
                        + ", ".join(PARTS))
    p.add_argument("--out", default=RESULTS,
                   help="writes OUT.json (resumed from), OUT.md, OUT.log")
    p.add_argument("--budget_seconds", type=float, default=None,
                   help="start nothing that would end later, stop at it "
                        "(0: no budget; default 420, none with --smoke)")
    p.add_argument("--backends", default="jax,torch",
                   help="comma-separated backends whose items of parts a, b "
                        "and compiled run")
    p.add_argument("--a_items", default="",
                   help="comma-separated keys of part a's items to run "
                        "(default: all), e.g. torch|keras|lars_mixed")
    p.add_argument("--compiled_seconds", type=float, default=400,
                   help="the most each item of part compiled may take, "
                        "torch.compile of ResNet-50 included (then it is "
                        "recorded as failed)")
    p.add_argument("--eigen", default="",
                   help="the Eigen headers' tarball for part cuda (default: "
                        "eigen.tar.gz beside --data_dir, else in "
                        ".gpu_campaign/)")
    p.add_argument("--data_dir", default="",
                   help="Fashion-MNIST's folder (default: where the training "
                        "command looks)")
    p.add_argument("--study_workers", type=int, default=0,
                   help="processes sharing the GPU in part c (default 12; 2 "
                        "with --smoke)")
    p.add_argument("--study_plan", default="",
                   help="the plan part c runs (bench/study/plans.py; default "
                        "depth, smoke with --smoke)")
    p.add_argument("--work_dir", default="",
                   help="model folders of the study's runs (default: "
                        "runs/gpu_campaign; OUT_runs with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes on this machine, through the same code")
    p.add_argument("--prepare", metavar="DIR",
                   help="put the wheels and data for the GPU machine in DIR "
                        "and print the device commands")
    p.add_argument("--child", metavar="TASK", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    for flag, allowed in (("parts", PARTS), ("backends", ("jax", "torch"))):
        names = [x.strip() for x in getattr(args, flag).split(",") if x.strip()]
        for name in [n for n in names if n not in allowed]:
            p.error(f"--{flag}: each {flag[:-1]} must be one of "
                    f"{', '.join(allowed)}. Received: {name}")
        setattr(args, flag, names)

    if args.study_workers < 0:
        p.error(f"--study_workers must be >= 0. Received: {args.study_workers}")
    args.study_workers = args.study_workers or (2 if args.smoke else 12)
    args.study_plan = args.study_plan or ("smoke" if args.smoke else "depth")
    if args.budget_seconds is None:
        args.budget_seconds = 0 if args.smoke else 420
    if args.budget_seconds < 0:
        p.error(f"--budget_seconds must be >= 0. Received: "
                f"{args.budget_seconds}")
    args.work_dir = args.work_dir or (
        args.out + "_runs" if args.smoke else os.path.join("runs", "gpu_campaign"))
    return args


def a_items(items, compiled=False):
    """Part a's tasks; `compiled`: the step Keras compiles with
    `jit_compile=True` (keys end in `|compiled`)."""
    return [dict(key="|".join(i) + ("|compiled" if compiled else ""),
                 backend=i[0], model=i[1], optimizer=i[2], compiled=compiled)
            for i in items]


def b_items():
    return [dict(key=b, backend=b) for b in B_BACKENDS]


def prepare(folder):
    """Wheels and Fashion-MNIST for the GPU machine, in `folder`."""
    from keras_largebatch.train import data

    wheels = os.path.join(folder, "wheels")
    os.makedirs(wheels, exist_ok=True)
    version = study_runner.version
    pins = [f"{p}=={version(p)}" if version(p) else p for p in WHEELS]
    platforms = [x for tag in PLATFORMS for x in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", wheels, *pins],
                   check=True)
    source = data.find_fashion_mnist()
    if source is None:
        subprocess.run(["apt-get", "install", "-y", "dataset-fashion-mnist"],
                       check=True)
        source = data.find_fashion_mnist()
    if source is None:
        sys.exit("Fashion-MNIST not found (dataset-fashion-mnist installed?)")
    target = os.path.join(folder, "fashion-mnist")
    os.makedirs(target, exist_ok=True)
    for name in data.FASHION_MNIST_FILES:
        shutil.copy(os.path.join(source, name), target)
    # Part cuda's Eigen headers, from TensorFlow's include folder here.
    subprocess.run([sys.executable, os.path.join(
        ROOT, "native", "tests", "pack_eigen.py"),
        os.path.join(folder, "eigen.tar.gz")], check=True)
    size = sum(os.path.getsize(p) for p in glob.glob(
        os.path.join(folder, "**"), recursive=True) if os.path.isfile(p))
    mib = size / 2**20
    if mib > PREPARED_LIMIT_MIB:
        sys.exit(f"{folder} holds {mib:.1f} MiB, over {PREPARED_LIMIT_MIB}")
    rel = os.path.relpath(os.path.abspath(folder), ROOT)
    print(f"\n{folder}: {mib:.1f} MiB "
          f"({len(os.listdir(wheels))} wheels, Fashion-MNIST, Eigen)\n")
    print("Device command (run it until it prints 'campaign complete'; "
          f"carry [\"{rel}\"]; each call resumes from bench/results/: copy "
          "the call's files (gpu_campaign.json and .md, the plan's record) "
          "into bench/results/ before the next):\n")
    # Install the wheels, run the campaign (its default budget), bring back
    # its record, report and the depth plan's record.
    print("python3 -m pip install -q --no-index --no-deps --no-compile "
          f"--no-cache-dir --upgrade --target /tmp/site {rel}/wheels/*.whl && "
          "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; "
          f"python3 -m bench.gpu_campaign --data_dir {rel}/fashion-mnist "
          f"--eigen {rel}/eigen.tar.gz 2>&1 | tee $OUT/campaign.log; "
          "cp bench/results/gpu_campaign* bench/results/lars_depth_study.json"
          " $OUT/ 2>/dev/null")


def run_cuda(campaign):
    """Part cuda: builds and runs the fusion kernels' device test (compiled
    only with --smoke); True once it has passed (or compiled, smoke)."""
    args = campaign.args
    store = campaign.record.setdefault("cuda", {})
    if store.get("passed"):
        return True
    eigen = args.eigen or (
        os.path.join(os.path.dirname(os.path.abspath(args.data_dir)),
                     "eigen.tar.gz") if args.data_dir else
        os.path.join(ROOT, ".gpu_campaign", "eigen.tar.gz"))
    if args.smoke and not (os.path.exists(eigen) and shutil.which("nvcc")):
        # The rehearsal compiles the test where nvcc and the headers are.
        print("cuda: skipped in the smoke run (needs nvcc and "
              f"{eigen}: python -m bench.gpu_campaign --prepare)", flush=True)
        store.update(skipped=True)
        return True
    cmd = ["bash", os.path.join(ROOT, "native", "tests", "device_test.sh"),
           "--eigen-tar", eigen, "--arch", "sm_90", "--out", args.out + "_cuda.txt"]
    if args.smoke:
        cmd.append("--compile-only")
    start, left = study_runner.now(), campaign.left()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=None if left == float("inf") else max(left, 1))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    shown = [os.path.relpath(c, ROOT) if os.path.isabs(c) else c for c in cmd]
    store.update(command=" ".join(shown), returncode=proc.returncode,
                 summary=lines[-1] if lines else "", started=start,
                 finished=study_runner.now(), passed=proc.returncode == 0,
                 compile_only=args.smoke)
    print(f"cuda: {store['summary']} (exit {proc.returncode})", flush=True)
    return store["passed"]


def run_c(campaign):
    """Part c: the study plan `--study_plan` run by the study's runner,
    `--study_workers` processes side by side, within the budget left;
    True once the plan has nothing left to run."""
    args = campaign.args
    record = campaign.record.setdefault("c", {})
    results = (os.path.dirname(os.path.abspath(args.out)) if args.smoke
               else study_runner.RESULTS)
    plan = plans.PLANS[args.study_plan]
    path = plan.path(results)
    env = dict(campaign.environ, KERAS_BACKEND="jax",
               XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / args.study_workers:.2f}")
    lines = record.setdefault("lines", [])

    def log(line):
        lines.append(line)
        print(f"c {line}", flush=True)

    left = campaign.left()
    study_runner.run(plan.all_specs, path, os.path.join(args.work_dir, plan.name),
                     args.study_workers,
                     0 if left == float("inf") else max(left - 20, 1),
                     args.data_dir, log=log, env=env)
    runs = study_runner.load(path)
    done = {study_runner.run_key(r) for r in runs}
    record.update(plan=plan.name, record=plan.record, complete=all(
        study_runner.run_key(s) in done for s in plan.all_specs(runs)))
    return record["complete"]


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args.child)
    # This process imports Keras for helpers only: on JAX's CPU platform, so
    # that it never takes GPU memory from the processes it starts, which
    # start from the environment as it was.
    environ = dict(os.environ)
    os.environ.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    if args.prepare:
        return prepare(args.prepare)
    if args.smoke and args.out == RESULTS:
        sys.exit("--smoke needs its own --out")
    if args.smoke and "c" in args.parts:
        from keras_largebatch.train import data

        if data.find_fashion_mnist(args.data_dir or None) is None:
            where = args.data_dir or "the folders the command reads"
            sys.exit(f"--smoke: part c trains on Fashion-MNIST, whose IDX "
                     f"files are not in {where} (pass --data_dir, or install "
                     "dataset-fashion-mnist)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    campaign = Campaign(args, markdown, environ)
    settings = SMOKE if args.smoke else dict(
        a=A_SETTINGS, b=B_SETTINGS)
    picks_a = SMOKE_A if args.smoke else A_ITEMS
    compiled = SMOKE_COMPILED if args.smoke else COMPILED_ITEMS
    picked = args.a_items.split(",") if args.a_items else None

    def chosen(items):
        return [i for i in items if i["backend"] in args.backends]

    steps = {
        "a": lambda: campaign.run_items(
            "a", [i for i in chosen(a_items(picks_a))
                  if picked is None or i["key"] in picked],
            settings["a"]),
        "b": lambda: campaign.run_items("b", chosen(b_items()),
                                        settings["b"]),
        "cuda": lambda: run_cuda(campaign),
        "compiled": lambda: campaign.run_items(
            "compiled", chosen(a_items(compiled, compiled=True)),
            settings["a"], item_seconds=args.compiled_seconds),
        "c": lambda: run_c(campaign),
    }
    complete = True
    try:
        for part in args.parts:
            # A part that fails is recorded and the next one still runs.
            if not steps[part]():
                complete = False
                continue
            missing = campaign.session.get("not_installed", {})
            if not any(part in p for p in missing.values()):
                campaign.session["finished"].append(part)
            campaign.save()
    except Deadline:
        complete = False
    campaign.save()
    print(markdown(campaign.record))
    missing = campaign.session.get("not_installed")
    if complete and missing:
        print("campaign not complete: " + "; ".join(
            f"{backend} is not installed here (parts {', '.join(p)})"
            for backend, p in missing.items())
            + f"; run again where it is to resume from {campaign.path}")
    else:
        print("campaign complete" if complete else
              f"budget spent: run again to resume from {campaign.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
