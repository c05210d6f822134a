"""Where, when and with what code a measurement ran: the machine stamp
every record and benchmark writes (`machine`), the kind of machine and
backend that arms of one comparison must share (`machine_kind`), the
commit and versions of the code (`code`), and the processor and boot a
run ended on (`processor`): float results repeat bit for bit on one
processor model, not across them."""

import datetime
import hashlib
import os
import platform
import subprocess
from importlib import metadata

import bench


def version(package):
    """The installed version of `package`; None where it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def framework_version(backend):
    """The installed version of a Keras backend's framework (None)."""
    packages = {"tensorflow": ("tensorflow", "tensorflow-cpu")}.get(
        backend, (backend,))
    return next(filter(None, map(version, packages)), None)


def nvidia_smi(query="name"):
    """nvidia-smi's answer to `--query-gpu=<query>`, a line a GPU ("" where
    there is none)."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")


def machine(backend=None):
    """'2-core x86_64 CPU VM, no GPU (JAX 0.10.2), 2026-11-27', or 'one
    NVIDIA H200 (JAX 0.11.2), 2026-11-27': where runs of `backend` (default
    KERAS_BACKEND's) run from this process."""
    backend = backend or os.environ.get("KERAS_BACKEND", "jax")
    found = framework_version(backend) or "?"
    name = {"jax": "JAX", "torch": "torch", "tensorflow": "TensorFlow"}
    software = f"{name.get(backend, backend)} {found}"
    gpu = nvidia_smi()
    where = (f"one {gpu.splitlines()[0]}" if gpu else
             f"{os.cpu_count()}-core {platform.machine()} CPU VM, no GPU")
    return f"{where} ({software}), {datetime.date.today().isoformat()}"


def processor():
    """{'cpu': the processor's model name and a digest of its instruction
    set flags ('AMD EPYC, flags 3f2a9c1b'), 'boot': this boot's id (a VM
    started anew has a new one)}, from Linux's /proc; '' where unreadable.
    Two runs on one `machine_kind` may still differ in the last bits where
    these differ (other kernels chosen for other instructions)."""
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    info = read("/proc/cpuinfo")
    field = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    flags = " ".join(sorted(field.get("flags", "").split()))
    cpu = field.get("model name", "")
    if cpu and flags:
        cpu += ", flags " + hashlib.sha256(flags.encode()).hexdigest()[:8]
    return dict(cpu=cpu,
                boot=read("/proc/sys/kernel/random/boot_id").strip())


def machine_kind(stamp):
    """The kind of machine and backend a stamp names: 'H100 / JAX',
    'H200 / JAX', 'CPU VM / TensorFlow', ...: arms are compared within one."""
    kind = next((k for k in ("H200", "H100") if k in (stamp or "")), "CPU VM")
    backend = next((b for b in ("JAX", "torch", "TensorFlow")
                    if f"({b} " in (stamp or "")), "JAX")
    return f"{kind} / {backend}"


def _git(*args):
    """git's output in the repository of this `bench` ("" where it fails)."""
    try:
        return subprocess.run(["git", "-C", bench.ROOT, *args],
                              capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


_CODE = {}


def code(backend=None):
    """The code a run ran: the commit of this tree (None outside git),
    `dirty` (tracked files changed outside `bench/results/`, which the
    runner itself writes), and the versions of the package, Keras and
    `backend`'s framework. Read once a process: a study runs from a tree
    that does not change under it."""
    backend = backend or os.environ.get("KERAS_BACKEND", "jax")
    if "commit" not in _CODE:
        commit = _git("rev-parse", "HEAD") or None
        changed = _git("status", "--porcelain", "--untracked-files=no",
                       "--", ".", ":(exclude)bench/results")
        _CODE.update(commit=commit, dirty=bool(commit and changed))
    return dict(_CODE, versions={
        "keras-largebatch": version("keras-largebatch"),
        "keras": version("keras"), backend: framework_version(backend)})


def stamp(spec):
    """Where, when and with what code a run ended: its machine
    (`machine`), host, time, `code`, and `processor`'s cpu and boot."""
    backend = spec.get("run_backend")
    return dict(machine=machine(backend), host=platform.node(),
                finished=now(), code=code(backend), **processor())
