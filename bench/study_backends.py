"""Which Keras backend runs the batch-scaling study's network fastest on
this machine: the study's own command (`bench/batch_scaling_study.py`'s
`train_argv`) for 2 epochs on each backend, the second epoch's training
images/s (the first compiles) at the small batch (128, one micro-batch a
step) and at 1,024 (4 accumulated micro-batches of 256), with `--side_by_side`
identical runs at once as the study runs them (2 on a 2-core CPU: each
process's own images/s, averaged).

The study's results do not depend on the backend (same model, data order
and arithmetic up to float rounding); this picks the one to run it with.

    python bench/study_backends.py [--backends jax,torch,tensorflow]

Adds each backend's row to bench/results/study_backends.json (kept across
calls) and prints a Markdown table.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_scaling_study as study  # noqa: E402
import large_batch_study as lbs  # noqa: E402

OUT = os.path.join(lbs.RESULTS, "study_backends.json")
EPOCHS = 2
CONFIGS = (("fixed 128", 128), ("fixed 1,024", 1024))


def measure(backend, batch, work_dir, data_dir="", side_by_side=1):
    """Images/s of the second epoch of the study's fixed `batch` run, the
    mean over `side_by_side` identical runs at once."""
    spec = dict(study.fixed_spec(batch, 0.2, 0), epochs=EPOCHS)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    procs = []
    for i in range(side_by_side):
        run_dir = os.path.join(work_dir, str(i))
        argv = study.train_argv(spec, run_dir, data_dir)
        argv = [a for a in argv if not a.startswith("--evals_per_epoch")]
        cmd = lbs.train_command([*argv, "--evals_per_epoch=1"])
        procs.append((run_dir, subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env)))
    speeds = []
    for run_dir, proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"{backend} failed:\n{err[-2000:]}")
        with open(os.path.join(study.model_dir_of(spec, run_dir),
                               "history.csv")) as f:
            speeds.append(float(list(csv.DictReader(f))[-1]["images_per_sec"]))
    return sum(speeds) / len(speeds)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="jax,torch,tensorflow")
    p.add_argument("--data_dir", default="")
    p.add_argument("--side_by_side", type=int, default=2)
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    if args.side_by_side < 1:
        p.error(f"--side_by_side must be >= 1. Received: {args.side_by_side}")
    record = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            record = json.load(f)
    table = record.setdefault("images_per_sec", {})
    record.update(
        machine=f"{platform.machine()}, {os.cpu_count()} cores",
        side_by_side=args.side_by_side,
        note="second epoch's training images/s (evaluation excluded) of "
             "each of the runs side by side, averaged; each backend's row "
             "with the date and command it was measured with")
    for backend in args.backends.split(","):
        row = {}
        for name, batch in CONFIGS:
            with tempfile.TemporaryDirectory() as work_dir:
                row[name] = measure(backend, batch, work_dir, args.data_dir,
                                    args.side_by_side)
            print(f"{backend} {name}: {row[name]:.0f} images/s", flush=True)
        table[backend] = dict(row, date=datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec="seconds"),
            command=" ".join(["python bench/study_backends.py",
                              *(argv or sys.argv[1:])]))
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    print("\n| backend | " + " | ".join(n for n, _ in CONFIGS) + " |")
    print("|---" * (1 + len(CONFIGS)) + "|")
    for backend, row in table.items():
        print(f"| {backend} | "
              + " | ".join(f"{row[n]:,.0f}" for n, _ in CONFIGS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
