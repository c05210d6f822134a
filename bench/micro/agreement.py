"""Cost of the step agreement a signal needs in a job of several processes.

`StopOnInterrupt` asks the job's agreement (`train/run/processes/
agreement.py`) at every update boundary whether a signal stops the job
there. On torch and TensorFlow that is a collective every update (a
2-number all-reduce on gloo, through the strategy); on JAX it is the
coordination service's preemption sync point. Here `--processes` processes
on loopback call `stop_at` with no signal `--calls` times after `--warmup`
calls; the table shows the median and 90th percentile of a call, in
microseconds, of the slowest process. The claims: docs/training.md
(Preemption).

    python -m bench.micro.agreement
    python -m bench.micro.agreement --backends torch --calls 2000

Prints a Markdown table and writes bench/results/agreement.json (`--out`).
"""

import argparse
import json
import os
import statistics
import time

from bench import micro

BACKENDS = ("torch", "tensorflow", "jax")


def _cluster():
    """(this worker's index, the workers' addresses) from `TF_CONFIG`, which
    `localhost.start` sets for every backend here."""
    config = json.loads(os.environ["TF_CONFIG"])
    return config["task"]["index"], config["cluster"]["worker"]


def _agreement(backend):
    """The agreement the command's driver makes for a job of this
    worker's processes on `backend`."""
    from keras_largebatch.train.run.processes import agreement

    index, workers = _cluster()
    if backend == "tensorflow":
        from keras_largebatch import distribute

        return agreement.TensorFlowFlags(
            distribute.MultiWorkerMirroredStrategy())
    if backend == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{workers[0]}",
                                rank=index, world_size=len(workers))
        return agreement.TorchFlags()
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(workers[0], len(workers), index)
    return agreement.JaxPreemption()


def worker(backend, calls, warmup, out):
    """Times `calls` calls of `stop_at` with no signal; writes the seconds
    of each to `out`."""
    from keras_largebatch._shared import atomic_write

    found = _agreement(backend)
    seconds = []
    for step in range(warmup + calls):
        start = time.perf_counter()
        assert found.stop_at(step, []) is None
        seconds.append(time.perf_counter() - start)
    found.barrier()
    atomic_write(out, json.dumps(seconds[warmup:]))
    found.close()


def measure(backend, processes, calls, warmup):
    """{median_us, p90_us}: per call, of the slowest process."""
    per_call = [max(c) for c in zip(*micro.workers(
        "agreement", backend, processes,
        lambda out: ("--worker", backend, "--calls", calls, "--warmup",
                     warmup, "--out", out),
        600, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1"))]
    deciles = statistics.quantiles(per_call, n=10)
    return dict(median_us=round(1e6 * statistics.median(per_call), 1),
                p90_us=round(1e6 * deciles[-1], 1))


def main():
    p = micro.parser(__doc__, "agreement")
    p.add_argument("--backends", nargs="+", choices=BACKENDS,
                   default=list(BACKENDS))
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.calls, args.warmup, args.out)
    rows = {b: measure(b, args.processes, args.calls, args.warmup)
            for b in args.backends}
    print(f"| backend | agreement | median µs/update | p90 µs |\n"
          f"|---|---|---|---|")
    names = dict(torch="gloo all-reduce", tensorflow="strategy all-reduce",
                 jax="preemption sync point")
    for b, r in rows.items():
        print(f"| {b} | {names[b]} | {r['median_us']:,} | {r['p90_us']:,} |")
    micro.write(args.out, dict(
        what="the agreement's cost per update boundary, no signal",
        processes=args.processes, calls=args.calls, warmup=args.warmup,
        results=rows, loadavg=round(os.getloadavg()[0], 1),
        **micro.stamp("agreement", args.backends)))


if __name__ == "__main__":
    main()
