"""Kills `keras-largebatch-train` at random steps; counts identical resumes.

    nice -n 15 python bench/kill_campaign.py --kills 10 [--setups jax,torch]

Per setup of `SETUPS`: an uninterrupted run, then K runs SIGKILLed (the last
process of a job) after a random micro-batch, each started again (every
process, same command). Identical: final weights equal bit for bit; a kill
costs the updates since the checkpoint the rerun resumed from. Writes
bench/results/kill_campaign.{json,md}; kills recorded there are skipped.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from keras_largebatch._shared import atomic_write

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "study"))
from runner import machine  # noqa: E402  The study's one machine stamp.

RESULTS = os.path.join(HERE, "results", "kill_campaign")
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

    from keras_largebatch.train import main, step_checkpoints

    if os.environ.get("KILL_AT"):
        at = tuple(map(int, os.environ["KILL_AT"].split(",")))
        fit = keras.Model.fit

        class Kill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if (self.epoch, batch) == at:
                    step = [c.step for c in self.others if isinstance(
                        c, step_checkpoints.StepCheckpoints)][0]
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
    main.run()


def job(setup, model_dir, kill=None):
    """Runs the setup's processes to their end: [(code, output)]."""
    from keras_largebatch.distribute import localhost

    backend, count, flags, _ = SETUPS[setup]
    command = [sys.executable, os.path.abspath(__file__), "--child", "--",
               *RUN, *flags, f"--model_dir={model_dir}"]
    env = {k: v for k, v in os.environ.items()
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


def identical(a, b):
    import keras
    import numpy as np

    final = [keras.saving.load_model(os.path.join(d, "final.keras"))
             for d in (a, b)]
    return all(map(np.array_equal, *(m.get_weights() for m in final)))


def one_kill(setup, index, seed, work):
    steps = SETUPS[setup][3]
    at = random.Random(f"{seed}-{setup}-{index}").randrange(3 * steps - 1)
    model_dir = os.path.join(work, f"{setup}_{index}")
    shutil.rmtree(model_dir, ignore_errors=True)
    start = time.time()
    killed = job(setup, model_dir, kill=f"{at // steps},{at % steps}")
    again = job(setup, model_dir)
    hit = re.search(r"killed in epoch (\d+) at step (\d+)",
                    "".join(o for _, o in killed))
    resumed = re.search(r"resumed from epoch (\d+), step (\d+)", again[0][1])
    ok = all(c == 0 for c, _ in again)
    lost = None
    if hit and resumed:
        lost = int(hit[2]) - (int(resumed[2]) if hit[1] == resumed[1] else 0)
    same = ok and identical(os.path.join(work, f"{setup}_reference"),
                            model_dir)
    shutil.rmtree(model_dir, ignore_errors=True)
    return {"setup": setup, "kill": index, "machine": machine(SETUPS[setup][0]),
            "killed_after_micro_batch": at,
            "killed_at": hit and hit[0], "resumed": resumed and resumed[0],
            "rerun_ok": ok, "identical": same, "steps_lost": lost,
            "seconds": round(time.time() - start, 1),
            "tail": "" if ok else again[-1][1][-800:]}


def report(record):
    rows = ["| setup | machine | kills | identical resumes | updates lost: "
            "max | median | seconds a kill (kill + rerun) |",
            "|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        kills = [r for r in record["kills"] if r["setup"] == setup]
        lost = [r["steps_lost"] for r in kills if r["steps_lost"] is not None]
        if kills:
            rows.append(f"| {setup} | {kills[-1].get('machine', '?')} | "
                        f"{len(kills)} | "
                        f"{sum(r['identical'] for r in kills)} | "
                        f"{max(lost, default='-')} | "
                        f"{f'{statistics.median(lost):g}' if lost else '-'} | "
                        f"{statistics.median(r['seconds'] for r in kills):.0f} |")
    return (f"# Kill campaign\n\n`{record['command']}` "
            f"({record['date']}); a checkpoint every {EVERY} updates "
            "(`--checkpoint_every_steps`), so a kill may lose at most "
            f"{EVERY}.\n\n" + "\n".join(rows) + "\n")


def main():
    parser = argparse.ArgumentParser()
    for name, default in (("kills", 10), ("seed", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--record", default=RESULTS,
                        help="writes RECORD.json and RECORD.md (resumed from)")
    parser.add_argument("--work", default=os.path.join(
        tempfile.gettempdir(), "kill_campaign"))
    args = parser.parse_args()
    record = {"kills": []}
    if os.path.exists(args.record + ".json"):
        with open(args.record + ".json") as f:
            record = json.load(f)
    record.update(date=machine().rsplit(", ", 1)[-1],
                  command="python bench/kill_campaign.py " + " ".join(
                      sys.argv[1:]))
    done = {(r["setup"], r["kill"]) for r in record["kills"]}
    for setup in args.setups.split(","):
        reference = os.path.join(args.work, f"{setup}_reference")
        for index in range(args.kills):
            if (setup, index) in done:
                continue
            if not os.path.exists(os.path.join(reference, "final.keras")):
                shutil.rmtree(reference, ignore_errors=True)
                runs = job(setup, reference)
                if any(code for code, _ in runs):
                    print(f"{setup}: the uninterrupted run failed:\n"
                          + runs[-1][1][-2000:], flush=True)
                    break
            result = one_kill(setup, index, args.seed, args.work)
            print(json.dumps(result), flush=True)
            record["kills"].append(result)
            os.makedirs(os.path.dirname(os.path.abspath(args.record)),
                        exist_ok=True)
            for suffix, text in ((".json", json.dumps(record, indent=1)),
                                 (".md", report(record))):
                atomic_write(args.record + suffix, text)
    print(report(record))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[3:])
    else:
        main()
