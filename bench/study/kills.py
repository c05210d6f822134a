"""The `kills` plan's program: one run of `keras-largebatch-train` SIGKILLed
after a micro-batch drawn from the spec's seed, started again (every
process, same command), and compared bit for bit with the setup's
uninterrupted run, made once per runs' folder (`reference`).

    python -m bench.study.kills SPEC_JSON WORK_DIR   # as the runner runs it

A spec with a `fault` (`damage`) also damages the run's newest checkpoint
file between the kill and the rerun, truncated to half or deleted (drawn
from the seed): the rerun must fall back to the newest checkpoint that
loads whole, say what it skipped, and still end bit for bit where the
reference ends.

Writes `result.json` in the run's folder: where it was killed, the file
damaged and how, where the rerun resumed and what it skipped, the updates
lost (at most `EVERY` without a fault) and whether the final weights equal
the reference's.
"""

import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import bench
from bench.core import runspec
from keras_largebatch.train import layout

EVERY = 2  # --checkpoint_every_steps: a kill loses at most this many updates
RUN = ["--dataset=digits", "--model=resnet_cifar", "--resnet_depth=8",
       "--resnet_width=4", "--epochs=3", "--warmup_epochs=0.5",
       "--verbose=2", "--deterministic", f"--checkpoint_every_steps={EVERY}"]
MULTI = ["--collective_timeout_seconds=30"]
FIXED = ["--global_batch_size=64", "--steps_per_epoch=8"]
# name: (backend, processes, flags, micro-batches per epoch)
SETUPS = {
    "jax": ("jax", 1, FIXED, 8),
    "torch": ("torch", 1, FIXED, 8),
    "tensorflow": ("tensorflow", 1, FIXED, 8),
    "jax_adaptive": ("jax", 1, [
        "--global_batch_size=32", "--steps_per_epoch=16",
        "--gradient_accumulation_steps=2", "--adaptive_batch=noise_scale",
        "--adaptive_start_multiple=1", "--max_global_batch_size=128"], 16),
    "jax_2_processes": ("jax", 2, FIXED + MULTI + [
        "--distribution=data_parallel"], 8),
    "tensorflow_2_workers": ("tensorflow", 2, FIXED + MULTI + [
        "--distribution=multi_worker"], 8),
}


def child(argv):
    """The command, SIGKILLed after micro-batch b of epoch e (KILL_AT=e,b)."""
    import keras

    from keras_largebatch.train import checkpointing
    from keras_largebatch.train import cli

    if os.environ.get("KILL_AT"):
        at = tuple(map(int, os.environ["KILL_AT"].split(",")))
        fit = keras.Model.fit

        class Kill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if (self.epoch, batch) == at:
                    step = [c.step for c in self.others if isinstance(
                        c, checkpointing.StepCheckpoints)][0]
                    print(f"killed in epoch {at[0] + 1} at step {step}",
                          flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        def fit_and_kill(self, *args, callbacks=(), **kwargs):
            kill = Kill()
            kill.others = list(callbacks)
            return fit(self, *args, callbacks=[*callbacks, kill], **kwargs)

        keras.Model.fit = fit_and_kill
    # As its own argv: a supervised JAX process runs this script again.
    sys.argv = [sys.argv[0], *argv]
    cli.run()


def job(setup, model_dir, kill=None):
    """Runs the setup's processes to their end: [(code, output)]."""
    from keras_largebatch.distribute import localhost

    backend, count, flags, _ = SETUPS[setup]
    command = bench.command("bench.study.kills", "--child", "--", *RUN,
                            *flags, f"--model_dir={model_dir}")
    env = {k: v for k, v in bench.environ().items()
           if k not in ("KILL_AT", "TF_CONFIG")}
    env["KERAS_BACKEND"] = backend
    ports = localhost.free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    if backend == "jax":
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    running, logs = [], [tempfile.TemporaryFile("w+") for _ in range(count)]
    for index in range(count):
        own = dict(env)
        if backend == "jax" and count > 1:
            own.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=cluster["worker"][0],
                       KERAS_DISTRIBUTION_NUM_PROCESSES=str(count),
                       KERAS_DISTRIBUTION_PROCESS_ID=str(index))
        if backend == "tensorflow" and count > 1:
            own["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {
                "type": "worker", "index": index}})
        if kill and index == count - 1:
            own["KILL_AT"] = kill
        running.append(subprocess.Popen(command, env=own, stdout=logs[index],
                                        stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=900) for p in running]
    finally:
        localhost.kill(running)
    for log in logs:
        log.seek(0)
    return [(code, log.read()) for code, log in zip(codes, logs)]


def reference(setup, work_dir):
    """The setup's uninterrupted run in `work_dir`, made by the first kill
    that needs it (a lock keeps two kills of one setup from both making
    it)."""
    path = os.path.join(work_dir, f"{setup}_reference")
    os.makedirs(work_dir, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(path, layout.EXPORT)):
            shutil.rmtree(path, ignore_errors=True)
            runs = job(setup, path)
            if any(code for code, _ in runs):
                sys.exit(f"{setup}: the uninterrupted run failed: " + (
                    runs[-1][1].strip().splitlines() or ["no output"])[-1])
    return path


def identical(a, b):
    import keras
    import numpy as np

    final = [keras.saving.load_model(os.path.join(d, layout.EXPORT))
             for d in (a, b)]
    return all(map(np.array_equal, *(m.get_weights() for m in final)))


def damage(model_dir, draw):
    """Truncates to half or deletes (drawn by `draw`) the newest file of the
    run's checkpoints (`backup/`, `checkpoints/`); returns what it did."""
    files = [os.path.join(d, name) for d in (
        os.path.join(model_dir, layout.BACKUP),
        os.path.join(model_dir, layout.CHECKPOINTS))
        if os.path.isdir(d) for name in os.listdir(d)
        if not name.startswith(".")]
    if not files:
        return None
    newest = max(files, key=lambda f: (os.stat(f).st_mtime_ns, f))
    how = draw.choice(("truncate", "delete"))
    if how == "delete":
        os.remove(newest)
    else:
        with open(newest, "r+b") as f:
            f.truncate(os.path.getsize(newest) // 2)
    return f"{how} {os.path.relpath(newest, model_dir)}"


def one_kill(spec, work_dir):
    """Kills a run of the spec's setup after a micro-batch drawn from its
    seed and index, reruns it and compares it with the reference."""
    setup, index = spec["setup"], spec["kill"]
    steps = SETUPS[setup][3]
    draw = random.Random(f"{spec['seed']}-{setup}-{index}")
    at = draw.randrange(3 * steps - 1)
    same_as = reference(setup, work_dir)
    model_dir = os.path.join(runspec.model_dir(spec, work_dir), "run")
    shutil.rmtree(model_dir, ignore_errors=True)
    killed = job(setup, model_dir, kill=f"{at // steps},{at % steps}")
    damaged = damage(model_dir, draw) if spec.get("fault") else None
    again = job(setup, model_dir)
    hit = re.search(r"killed in epoch (\d+) at step (\d+)",
                    "".join(o for _, o in killed))
    resumed = re.search(r"resumed from epoch (\d+), step (\d+)", again[0][1])
    ok = all(c == 0 for c, _ in again)
    lost = None
    if hit and resumed:
        lost = int(hit[2]) - (int(resumed[2]) if hit[1] == resumed[1] else 0)
    same = ok and identical(same_as, model_dir)
    shutil.rmtree(model_dir, ignore_errors=True)
    skipped = re.search(r"^.*skipp.*$", again[0][1], re.M)
    return {"killed_after_micro_batch": at, "damaged": damaged,
            "skipped": skipped and skipped[0].strip(),
            "killed_at": hit and hit[0], "resumed": resumed and resumed[0],
            "rerun_ok": ok, "identical": same, "steps_lost": lost,
            "tail": "" if ok else again[-1][1][-800:]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[3:])
    else:
        # The runner's stop at its budget: the job's processes go too.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
        spec, work = json.loads(sys.argv[1]), sys.argv[2]
        result = one_kill(spec, work)
        with open(os.path.join(runspec.model_dir(spec, work), "result.json"),
                  "w") as f:
            json.dump(result, f)
