"""Everything GPU-bound, in one resumable command of a few minutes.

Parts, in order of value: compiled (the torch step `jit_compile=True`
compiles), a (ResNet-50 training images/s), b (optimizer-step times), cuda
(the fusion kernels' device test), each a plan's tasks
(`bench/gpu_campaign/plan.py`), and c (a study plan); bench's process pool
(`bench/core/pool.py`) runs them all, parts compiled to cuda one task
at a time into `<out>.json`, part c side by side into its plan's record.
A rerun skips what is recorded. The parts, the files, how to prepare, run
and rehearse it: bench/README.md.
"""

import argparse
import glob
import os
import platform
import shutil
import subprocess
import sys
import time

# The plans import the package, hence Keras: on JAX (this machine may have
# no TensorFlow), as `main` has it.
os.environ.setdefault("KERAS_BACKEND", "jax")
from bench import ROOT  # noqa: E402
from bench.core import pool  # noqa: E402
from bench.core import provenance  # noqa: E402
from bench.core import records  # noqa: E402
from bench.core import runspec  # noqa: E402
from bench.gpu_campaign import plan as gpu_plan  # noqa: E402
from bench.gpu_campaign.report import markdown  # noqa: E402
from bench.study import engine  # noqa: E402

RESULTS = os.path.join(records.RESULTS, "gpu_campaign")
PARTS = (*gpu_plan.PARTS, "c")
VERSIONS = ["keras", "jax", "jaxlib", "torch", "numpy", "grain"]
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
                   help="writes OUT.json (resumed from) and OUT.md")
    p.add_argument("--budget_seconds", type=float, default=None,
                   help="start nothing that would end later, stop at it "
                        "(0: no budget; default 420, none with --smoke)")
    p.add_argument("--backends", default="jax,torch",
                   help="comma-separated backends whose items of parts a, b "
                        "and compiled run")
    p.add_argument("--a_items", default="",
                   help="comma-separated keys of part a's items to run "
                        "(default: all), e.g. torch|keras|lars_mixed")
    p.add_argument("--compiled_seconds", type=float,
                   default=gpu_plan.COMPILED_SECONDS,
                   help="the most each item of part compiled (and part "
                        "layers' compiled one) may take, "
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
                   help="the folders of the tasks' and the study's runs "
                        "(default: runs/gpu_campaign; OUT_runs with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes on this machine, through the same code")
    p.add_argument("--prepare", metavar="DIR",
                   help="put the wheels and data for the GPU machine in DIR "
                        "and print the device commands")
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


def prepare(folder):
    """Wheels and Fashion-MNIST for the GPU machine, in `folder`."""
    from keras_largebatch.train import data

    wheels = os.path.join(folder, "wheels")
    os.makedirs(wheels, exist_ok=True)
    version = provenance.version
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
    # its record, report, the device test's output and part c's record, by
    # name: the device tool brings back at most 8 files, and a glob of
    # bench/results/gpu_campaign* holds more (on 2026-11-30 it left the
    # plan's record behind).
    print("python3 -m pip install -q --no-index --no-deps --no-compile "
          f"--no-cache-dir --upgrade --target /tmp/site {rel}/wheels/*.whl && "
          "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; "
          f"python3 -m bench.gpu_campaign --data_dir {rel}/fashion-mnist "
          f"--eigen {rel}/eigen.tar.gz 2>&1 | tee $OUT/campaign.log; "
          "cp bench/results/gpu_campaign.json bench/results/gpu_campaign.md "
          "bench/results/gpu_campaign_cuda.txt "
          "bench/results/lars_depth_study.json $OUT/ 2>/dev/null")


def eigen(args):
    """Part cuda's Eigen tarball: `--eigen`, else beside `--data_dir`, else
    in .gpu_campaign/."""
    if args.eigen:
        return args.eigen
    if args.data_dir:
        return os.path.join(os.path.dirname(os.path.abspath(args.data_dir)),
                            "eigen.tar.gz")
    return os.path.join(ROOT, ".gpu_campaign", "eigen.tar.gz")


def part_specs(part, args):
    """The tasks of `part` this call may run: its plan's (the smoke's with
    `--smoke`), of `--backends` and, in part a, `--a_items`, with
    `--compiled_seconds` and part cuda's files."""
    plan = gpu_plan.GPU_SMOKE if args.smoke else gpu_plan.GPU_CHECK
    picked = args.a_items.split(",") if args.a_items else None
    specs = []
    for s in plan.specs:
        if s["part"] != part or s.get("run_backend", "jax") not in \
                args.backends:
            continue
        if part == "a" and picked and "|".join(
                (s["run_backend"], s["model"], s["optimizer"])) not in picked:
            continue
        if part == "compiled" or "limit_seconds" in s:
            s = dict(s, limit_seconds=args.compiled_seconds)
        if part == "cuda":
            s = dict(s, eigen=eigen(args), out=args.out + "_cuda.txt")
        specs.append(s)
    return specs


def run_part(part, args, left, env, session):
    """Runs part `part`'s tasks one at a time within `left` seconds; True
    once none is left but those of a backend not installed here (noted in
    `session`)."""
    path = args.out + ".json"
    specs = part_specs(part, args)
    stale = [r for r in records.load(path) + records.failures(path)
             if r["part"] == part and specs
             and r.get("settings") != specs[0].get("settings")]
    if stale:
        sys.exit(f"{path}: part {part} was measured with "
                 f"{stale[0]['settings']}, not {specs[0]['settings']}; use "
                 "another --out")
    pool.run(specs, path, os.path.join(args.work_dir, "tasks"), workers=1,
               budget=0 if left == float("inf") else left, env=env,
               log=lambda line: print(f"{part} {line}", flush=True))
    done = {runspec.run_key(r)
            for r in records.load(path) + records.failures(path)}
    left = [s for s in specs if runspec.run_key(s) not in done]
    absent = {s["run_backend"] for s in left
              if "run_backend" in s and not pool.installed(s["run_backend"])}
    for backend in sorted(absent):
        session.setdefault("not_installed", {}).setdefault(
            backend, []).append(part)
    if not left:
        session["finished"].append(part)
    return all(s.get("run_backend") in absent for s in left)


def run_c(args, left, env, c):
    """Part c: the study plan `--study_plan` run by the study's runner,
    `--study_workers` processes side by side, within `left` seconds; `c`
    (the record's summary of part c) with this call's lines and whether
    the plan has nothing left to run."""
    results = (os.path.dirname(os.path.abspath(args.out)) if args.smoke
               else records.RESULTS)
    plan = engine.PLANS[args.study_plan]
    path = plan.path(results)
    env = dict(env, KERAS_BACKEND="jax",
               XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / args.study_workers:.2f}")
    lines = list(c.get("lines", []))

    def log(line):
        lines.append(line)
        print(f"c {line}", flush=True)

    pool.run(plan.specs_here, path, os.path.join(args.work_dir, plan.name),
               args.study_workers,
               0 if left == float("inf") else max(left - 20, 1),
               args.data_dir, log=log, env=env)
    runs = records.load(path)
    done = runspec.finished_keys(runs)
    return dict(c, plan=plan.name, record=plan.record, lines=lines,
                complete=all(runspec.run_key(s) in done
                             for s in plan.specs_here(runs)))


def main(argv=None):
    args = parse_args(argv)
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
    from keras_largebatch._shared import atomic_write

    path = args.out + ".json"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = records.read(path)
    if record.get("smoke", args.smoke) != args.smoke:
        sys.exit(f"{path} holds a {'smoke' if args.smoke else 'real'}"
                 " campaign's opposite; use another --out")
    session = dict(
        started=provenance.now(), command="python -m bench.gpu_campaign "
        + " ".join(sys.argv[1:]), parts=args.parts,
        host=f"{platform.machine()}, {os.cpu_count()} CPUs",
        gpu=provenance.nvidia_smi("name,memory.total,driver_version").replace(
            "\n", "; ") or None, python=platform.python_version(),
        versions={p: provenance.version(p) for p in VERSIONS}, finished=[])
    sessions, c = record.get("sessions", []) + [session], record.get("c")
    started = time.monotonic()
    deadline = started + args.budget_seconds if args.budget_seconds else \
        float("inf")

    def save():
        session["seconds"] = round(time.monotonic() - started, 1)
        records.save(path, records.load(path), smoke=args.smoke,
                    sessions=sessions, **({"c": c} if c else {}))
        atomic_write(args.out + ".md", markdown(records.read(path)))

    save()
    env = dict(environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    complete = True
    try:
        for part in args.parts:
            left = deadline - time.monotonic()
            if left <= 0:
                complete = False
                break
            if part == "c":
                c = run_c(args, left, environ, c or {})
                complete = complete and c["complete"]
                if c["complete"]:
                    session["finished"].append(part)
            elif not run_part(part, args, left, env, session):
                complete = False  # The budget: nothing more starts.
                break
            save()
    except pool.NoGPU as e:
        save()
        sys.exit(f"{e.code}; only --smoke runs on a CPU")
    save()
    print(markdown(records.read(path)))
    missing = session.get("not_installed")
    if complete and missing:
        print("campaign not complete: " + "; ".join(
            f"{backend} is not installed here (parts {', '.join(p)})"
            for backend, p in missing.items())
            + f"; run again where it is to resume from {path}")
    else:
        print("campaign complete" if complete else
              f"budget spent: run again to resume from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
