"""The runner of `bench/gpu_campaign.py`: a `Worker` is one `--child`
process of one backend (Keras fixes it at import); a `Campaign` keeps the
record (`<out>.json`, resumed from, and `<out>.md`) and the budget, and
runs a part's tasks over its workers (`run_items`).
"""

import datetime
import importlib.util
import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
import traceback

import gpu_campaign_report as report
from runner import now  # The study's runner (bench/study/).
from runner import nvidia_smi
from runner import version

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "gpu_campaign.py")
VERSIONS = ["keras", "jax", "jaxlib", "torch", "numpy", "grain"]


def child(tasks):
    """A worker: one JSON task a line on stdin, one `RESULT`/`FAILED` line
    each on stdout; `tasks[part](task)` runs a task."""
    import keras

    from gpu_campaign_parts import bench_module

    apps = bench_module("applications")
    backend = keras.backend.backend()
    facts = {"backend": backend, "device": apps.device_name(backend)}
    print("READY " + json.dumps(facts), flush=True)
    for line in sys.stdin:
        task = json.loads(line)
        try:
            result = tasks[task["part"]](task)
        except Exception:  # noqa: BLE001 - reported to the parent
            print("FAILED " + json.dumps(traceback.format_exc()), flush=True)
            continue
        print("RESULT " + json.dumps(dict(result, **facts)), flush=True)


class Worker:
    """A child process of one backend; its result lines go to `results`."""

    environ = None  # The environment workers start from (default: ours).

    def __init__(self, backend, results, log_path):
        env = dict(self.environ or os.environ, KERAS_BACKEND=backend,
                   TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, "--child"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, cwd=os.getcwd())
        self.backend = backend
        self.reader = threading.Thread(target=self._read, args=(results,),
                                       daemon=True)
        self.reader.start()

    def _read(self, results):
        for line in self.proc.stdout:
            self.log.write(line)
            for tag in ("READY", "RESULT", "FAILED"):
                if line.startswith(tag + " "):
                    results.put((self, tag, json.loads(line[len(tag) + 1:])))
        results.put((self, "EXIT", self.proc.wait()))

    def send(self, task):
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)  # It writes to the log until EOF.
        self.log.close()


class Deadline(Exception):
    """The budget ran out; finished items are saved."""


class Campaign:
    """The JSON record, the budget and the workers of one invocation."""

    def __init__(self, args):
        self.args, self.path = args, args.out + ".json"
        self.deadline = (time.time() + args.budget_seconds
                         if args.budget_seconds else float("inf"))
        self.record = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.record = json.load(f)
        if self.record.get("smoke", args.smoke) != args.smoke:
            sys.exit(f"{self.path} holds a {'smoke' if args.smoke else 'real'}"
                     " campaign's opposite; use another --out")
        self.record["smoke"] = args.smoke
        self.session = dict(
            started=now(), command="python bench/gpu_campaign.py "
            + " ".join(sys.argv[1:]), parts=args.parts,
            host=f"{platform.machine()}, {os.cpu_count()} CPUs",
            gpu=nvidia_smi("name,memory.total,driver_version").replace(
                "\n", "; ") or None, python=platform.python_version(),
            versions={p: version(p) for p in VERSIONS}, finished=[])
        self.record.setdefault("sessions", []).append(self.session)
        self.results = queue.Queue()
        self.log_path = args.out + ".log"

    def save(self):
        from keras_largebatch._shared import atomic_write

        started = datetime.datetime.fromisoformat(self.session["started"])
        self.session["seconds"] = round(time.time() - started.timestamp(), 1)
        atomic_write(self.path, json.dumps(self.record, indent=1))
        atomic_write(self.args.out + ".md", report.markdown(self.record))

    def left(self):
        return self.deadline - time.time()

    def wait(self, until=float("inf")):
        """The next line of any worker; `Deadline` at the budget's end, or
        None at `until` (a time.time()) if that comes first."""
        left = min(self.left(), until - time.time())
        try:
            return self.results.get(
                timeout=None if left == float("inf") else max(left, 0))
        except queue.Empty:
            if self.left() <= 0:
                raise Deadline from None
            return None

    def installed(self, part, backend, count):
        """Whether `backend`'s package is here; if not, says so once and
        notes the `count` items of `part` left unmeasured."""
        if importlib.util.find_spec(backend) is not None:
            return True
        missing = self.session.setdefault("not_installed", {})
        if part not in missing.setdefault(backend, []):
            missing[backend].append(part)
            print(f"part {part}: {backend} is not installed here; its "
                  f"{count} item(s) are not measured", flush=True)
        return False

    def run_items(self, part, items, settings, item_seconds=None):
        """Runs the `items` (task dicts with a `key` and a `backend`) not yet
        in the record, one worker per run of same-backend items; one that
        fails or runs past `item_seconds` is kept under `failed` and the rest
        go on. True when every item of an installed backend is done or failed."""
        store = self.record.setdefault(part, {})
        if store.get("settings", settings) != settings:
            sys.exit(f"{self.path}: part {part} was measured with "
                     f"{store['settings']}, not {settings}; use another --out")
        store["settings"] = settings
        done = store.setdefault("results", {})
        failed = store.setdefault("failed", {})
        todo = [i for i in items if i["key"] not in done
                and i["key"] not in failed]
        absent = {b for b in {i["backend"] for i in todo} if not self.installed(
            part, b, sum(i["backend"] == b for i in todo))}
        todo = [i for i in todo if i["backend"] not in absent]
        worker, seconds = None, {}
        try:
            for item in todo:
                # An item that would not end in time is not started.
                if self.left() < seconds.get(item["backend"], 0):
                    raise Deadline
                if worker and worker.backend != item["backend"]:
                    worker.stop()
                    worker = None
                worker = worker or self.start(item["backend"])
                start = time.time()
                until = start + item_seconds if item_seconds else float("inf")
                worker.send(dict(item, part=part, settings=settings))
                while True:
                    got, tag, value = self.wait(until) or (
                        worker, "TIMEOUT",
                        f"did not finish within {item_seconds:g} s")
                    if got is not worker:
                        continue
                    if tag == "RESULT":
                        took = time.time() - start
                        seconds[item["backend"]] = max(
                            seconds.get(item["backend"], 0), took)
                        done[item["key"]] = dict(
                            value, seconds=round(took, 1), finished=now())
                        self.save()
                        print(f"{part} {item['key']}: {report.brief(value)}",
                              flush=True)
                        break
                    # A failed item is kept with its error, and the part
                    # goes on in a fresh worker.
                    worker.stop()
                    worker = None
                    failed[item["key"]] = dict(
                        error=str(value)[-2000:], finished=now())
                    self.save()
                    print(f"{part} {item['key']}: FAILED ({tag}); "
                          f"{str(value).strip().splitlines()[-1:]}",
                          flush=True)
                    break
        finally:
            if worker:
                worker.stop()
        return all(i["key"] in done or i["key"] in failed for i in todo)

    def start(self, backend):
        """A new worker, once it is ready. It is the only one running: the
        lines of workers stopped before it are dropped."""
        worker = Worker(backend, self.results, self.log_path)
        while True:
            got, tag, value = self.wait()
            if got is not worker:
                continue
            if tag != "READY":
                sys.exit(f"a {backend} worker ended ({tag}) before "
                         f"starting; see {self.log_path}")
            # A campaign on a CPU would spend its budget measuring nothing:
            # only the smoke may run there.
            if not self.args.smoke and value["device"].startswith("cpu"):
                worker.stop()
                sys.exit(f"{backend} sees no GPU ({value['device']}); the "
                         "campaign needs one (or --smoke)")
            return worker
