"""Everything GPU-bound, in one resumable command (issue #23).

Parts, in order of value, each a list of items that are measured once:

a. ResNet-50 training images/s at 224x224, batch 256, `mixed_float16`, one
   synthetic batch on the device, the step `fit` compiles, median of 20
   steps after 5 warm-up steps (`bench/applications.py`'s
   `fit_images_per_s`): on `keras.applications.ResNet50`, Keras'
   `LossScaleOptimizer(SGD)` against `LARSMixed` and `LAMBMixed`; under
   `LossScaleOptimizer(SGD)`, `keras.applications.ResNet50` against ours (v1,
   v1.5, each with and without conv biases); JAX and torch.
b. The optimizer-step times and ratios of `bench/optimizer_step.py`
   (its `measure_backend`), JAX and torch.
c. The large-batch study of `bench/large_batch_study.py` (its `plan`,
   `train_argv`, `collect`, `claims` and `report`) with ResNet-20 (width 16)
   on Fashion-MNIST, JAX: B = 128 and 32 x B; SGD, LARSMixed, LAMBMixed;
   8-epoch sweeps, second seeds, 32-epoch runs, then the grown batches
   (`--adaptive_batch=noise_scale` and `schedule`, from B up to 32 x B;
   they wait until the command has the flag), then 96-epoch runs, then
   64 x B. Batches above 256 accumulate gradients over micro-batches of
   256, as in the CPU study (batch norm per 256 images). Each run is
   `keras_largebatch.train.main.main(argv)` inside one of `--study_workers`
   long-lived processes sharing the GPU.

Each backend runs in its own process (Keras fixes it at import). Finished
items are kept in `<out>.json` and skipped by a rerun, so each call can be
one 10-minute device command: `--budget_seconds` stops starting work that
would not end in time and stops what runs at the deadline (losing only the
item in progress). `<out>.md` holds the tables, the device, the versions,
the dates and the commands.

    python bench/gpu_campaign.py --prepare .gpu_campaign   # here, once
    python bench/gpu_campaign.py --data_dir .gpu_campaign/fashion-mnist
    python bench/gpu_campaign.py --smoke --out /tmp/smoke  # a CPU, minutes

`--prepare DIR` puts the wheels the GPU image lacks and Fashion-MNIST into
DIR and prints the device commands. `--smoke` runs every part with tiny
sizes, through the same code (part c on Fashion-MNIST, as the GPU runs).
A backend that is not installed is said once; its items are left for a
call where it is. `bench/gpu_campaign_rehearsal.sh` rehearses the GPU
image on a CPU: a Python 3.12 venv with the image's packages, then only
the prepared wheels, then `--smoke`.

The code: `gpu_campaign_runner.py` (workers, budget, record),
`gpu_campaign_parts.py` (the parts' settings and tasks, part c's plan),
`gpu_campaign_report.py` (`<out>.md`), `gpu_campaign_prepare.py`
(`--prepare`); this file parses the arguments and runs the parts.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # Imported by its path rather than run.
    sys.path.append(HERE)

import gpu_campaign_parts as parts  # noqa: E402
import gpu_campaign_prepare  # noqa: E402
import gpu_campaign_report  # noqa: E402
import gpu_campaign_runner as runner  # noqa: E402

RESULTS = os.path.join(HERE, "results", "gpu_campaign")
# The pieces by their former names here.
Campaign, Deadline, Worker = runner.Campaign, runner.Deadline, runner.Worker
markdown, estimate = gpu_campaign_report.markdown, parts.estimate
prepare, device_command = (gpu_campaign_prepare.prepare,
                           gpu_campaign_prepare.device_command)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="a,b,c",
                   help="comma-separated parts to run, in order: a, b, c")
    p.add_argument("--out", default=RESULTS,
                   help="writes OUT.json (resumed from), OUT.md, OUT.log")
    p.add_argument("--budget_seconds", type=float, default=0,
                   help="start nothing that would end later, stop at it "
                        "(0: no budget)")
    p.add_argument("--data_dir", default="",
                   help="Fashion-MNIST's folder (default: where the training "
                        "command looks)")
    p.add_argument("--study_workers", type=int, default=0,
                   help="processes sharing the GPU in part c (default 3; 2 "
                        "with --smoke)")
    p.add_argument("--work_dir", default="",
                   help="model folders of the study's runs (default: "
                        "runs/gpu_campaign; OUT_runs with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes on this machine, through the same code")
    p.add_argument("--prepare", metavar="DIR",
                   help="put the wheels and data for the GPU machine in DIR "
                        "and print the device commands")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    for part in args.parts:
        if part not in ("a", "b", "c"):
            p.error(f"--parts: each part must be a, b or c. Received: {part}")
    if args.study_workers < 0:
        p.error(f"--study_workers must be >= 0. Received: {args.study_workers}")
    args.study_workers = args.study_workers or (2 if args.smoke else 3)
    args.work_dir = args.work_dir or (
        args.out + "_runs" if args.smoke else os.path.join("runs", "gpu_campaign"))
    args.dataset = "fashion_mnist"
    return args


def run_c(campaign, settings):
    """Part c over `--study_workers` JAX workers sharing the device."""
    record = campaign.record.setdefault("c", {"runs": []})
    plan = parts.StudyPlan(settings, campaign.args, record, campaign.session,
                           runner.now())
    count = campaign.args.study_workers
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / count:.2f}"}
    record["complete"] = campaign.run_pool(plan, count, env)
    return record["complete"]


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return runner.child(parts.TASKS)
    # This process imports Keras for helpers only: on JAX's CPU platform, so
    # that it never takes GPU memory from its workers, which start from the
    # environment as it was.
    Worker.environ = dict(os.environ)
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
    campaign = Campaign(args)
    settings = parts.SMOKE if args.smoke else dict(
        a=parts.A_SETTINGS, b=parts.B_SETTINGS, c=parts.C_SETTINGS)
    a_items = parts.SMOKE_A if args.smoke else parts.A_ITEMS
    steps = {
        "a": lambda: campaign.run_items("a", parts.a_items(a_items),
                                        settings["a"]),
        "b": lambda: campaign.run_items("b", parts.b_items(), settings["b"]),
        "c": lambda: run_c(campaign, settings["c"]),
    }
    complete = True
    try:
        for part in args.parts:
            if not steps[part]():
                complete = False
                break
            missing = campaign.session.get("not_installed", {})
            if not any(part in p for p in missing.values()):
                campaign.session["finished"].append(part)
            campaign.save()
    except Deadline:
        complete = False
    campaign.save()
    print(markdown(campaign.record, args.out + "_study.md"))
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
