"""Builds the native fusion ops (`native/`) into the package, if it can.

pip builds in an isolated environment where TensorFlow is not importable, so
the target interpreter (`sys.executable`, or `KERAS_LARGEBATCH_TF_PYTHON`) is
asked for `tf.sysconfig` in a subprocess without pip's isolation variables.

`KERAS_LARGEBATCH_BUILD_NATIVE` says what to build:
  - `1` (default): the CPU kernels when TensorFlow is installed, and the CUDA
    kernels (`*.cu.cc`) too when TensorFlow is built with CUDA and nvcc is
    found. What cannot be built is skipped: no TensorFlow or a failed compile
    installs the package without the library (`keras_largebatch.distribute.
    native` then falls back to pure TensorFlow); a failed CUDA compile keeps
    the CPU kernels.
  - `cuda`: the CPU and the CUDA kernels, or the install fails.
  - `0`: nothing.
Every build ends with one line, a Python warning so that pip shows it without
`-v`, that says whether the CUDA kernels were built and why not.

CUDA is found from `CUDA_HOME` or `CUDA_PATH`, else from the toolkit that the
`nvcc` on the PATH reports (`TOP` in `nvcc --dryrun`: the PATH's nvcc may be a
wrapper script), else `/usr/local/cuda`. The kernels are compiled for
TensorFlow's own architectures (`tf.sysconfig.get_build_info()`) that this
nvcc supports (`TF_CUDA_COMPUTE_CAPABILITIES`, e.g. "sm_90,compute_90",
overrides), and the CUDA runtime is linked statically, as TensorFlow's
`tf_custom_op_library` does: the library then needs no `libcudart.so` of
nvcc's version beside TensorFlow's own (12.5 for TensorFlow 2.21), only a
driver that supports nvcc's CUDA version.

`-mavx -mf16c` are added when the build CPU has them
(`KERAS_LARGEBATCH_NATIVE_CFLAGS` overrides), so build wheels for other
machines with that set to "".
"""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from setuptools import Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "keras_largebatch.distribute._lb_fusion_ops"
SOURCES = ["native/ops/lb_fusion_ops.cc", "native/kernels/lb_fusion_kernels.cc"]
CUDA_SOURCES = ["native/kernels/lb_fusion_kernels.cu.cc"]
HEADERS = ["native/kernels/lb_fusion_kernels.h"]
MODES = ("0", "1", "cuda")

_QUERY = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
build = tf.sysconfig.get_build_info()
print("LB_TF_INFO=" + json.dumps({
    "version": tf.__version__,
    "cflags": tf.sysconfig.get_compile_flags(),
    "lflags": tf.sysconfig.get_link_flags(),
    "cuda": tf.test.is_built_with_cuda(),
    "cuda_version": build.get("cuda_version"),
    "cuda_archs": list(build.get("cuda_compute_capabilities") or []),
}))
"""


class NativeBuildError(Exception):
    """Why the native library (or its CUDA part) cannot be built."""


class Cuda(NamedTuple):
    """A CUDA toolkit: its nvcc, release, headers and static runtime."""

    nvcc: str
    home: str
    release: str
    include: str
    libdir: str


def _log(message):
    print(f"keras-largebatch native build: {message}", file=sys.stderr)


def _status(message):
    """The build's one summary line, a warning (pip shows warnings without
    `-v`)."""
    warnings.warn(f"keras-largebatch native build: {message}", stacklevel=2)


def query_tensorflow():
    """`tf.sysconfig` of the target environment's TensorFlow, or None."""
    python = os.environ.get("KERAS_LARGEBATCH_TF_PYTHON", sys.executable)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")
    }
    try:
        out = subprocess.run(
            [python, "-c", _QUERY],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        _log(f"could not run {python}: {e}")
        return None
    for line in out.stdout.splitlines():
        if line.startswith("LB_TF_INFO="):
            return json.loads(line[len("LB_TF_INFO="):])
    if "No module named 'tensorflow'" not in out.stderr:
        # Installed but broken: the summary line alone would hide why.
        _log(f"TensorFlow is not importable by {python}: "
             f"{out.stderr.strip()[-300:]}")
    return None


def _nvcc_output(nvcc, *args):
    result = subprocess.run([nvcc, *args], capture_output=True, text=True,
                            timeout=120)
    return result.stdout + result.stderr


def _nvcc_top(nvcc):
    """The toolkit nvcc runs from (`#$ TOP=...` of `nvcc --dryrun`), or None."""
    try:
        out = _nvcc_output(nvcc, "--dryrun", "-x", "cu", "-c", os.devnull,
                           "-o", os.devnull)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^#\$ TOP=(.+)$", out, re.MULTILINE)
    return os.path.realpath(match.group(1).strip()) if match else None


def find_cuda():
    """The CUDA toolkit to build with; `NativeBuildError` if there is none."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            home = os.environ[var]
            nvcc = os.path.join(home, "bin", "nvcc")
            if not os.access(nvcc, os.X_OK):
                raise NativeBuildError(f"{var}={home} has no bin/nvcc")
            break
    else:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.access(nvcc, os.X_OK):
            raise NativeBuildError(
                "nvcc not found (set CUDA_HOME, or put nvcc on the PATH)")
        home = _nvcc_top(nvcc) or "/usr/local/cuda"
    try:
        version = _nvcc_output(nvcc, "--version")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeBuildError(f"{nvcc} --version failed: {e}") from None
    match = re.search(r"release ([0-9.]+)", version)
    libdirs = [os.path.join(home, d) for d in ("lib64", "lib")]
    libdirs += sorted(glob.glob(os.path.join(home, "targets", "*", "lib")))
    for libdir in libdirs:
        if os.path.exists(os.path.join(libdir, "libcudart_static.a")):
            return Cuda(nvcc, home, match.group(1) if match else "unknown",
                        os.path.join(home, "include"), libdir)
    raise NativeBuildError(
        f"no libcudart_static.a in {home} (lib64, lib, targets/*/lib); "
        "set CUDA_HOME to the toolkit")


def gencode_flags(cuda, tf_archs):
    """`-gencode` flags: TensorFlow's architectures that this nvcc supports.

    `sm_XX` entries become device code (SASS), `compute_XX` entries PTX that
    the driver compiles for newer GPUs. `TF_CUDA_COMPUTE_CAPABILITIES`
    replaces TensorFlow's list.
    """
    if os.environ.get("TF_CUDA_COMPUTE_CAPABILITIES"):
        tf_archs = os.environ["TF_CUDA_COMPUTE_CAPABILITIES"].split(",")
    codes = set(_nvcc_output(cuda.nvcc, "--list-gpu-code").split())
    archs = set(_nvcc_output(cuda.nvcc, "--list-gpu-arch").split())
    flags, used = [], []
    for arch in (a.strip() for a in tf_archs):
        number = arch.split("_")[-1]
        if arch.startswith("sm_") and arch in codes:
            flags.append(f"-gencode=arch=compute_{number},code={arch}")
        elif arch.startswith("compute_") and arch in archs:
            flags.append(f"-gencode=arch={arch},code={arch}")
        else:
            continue
        used.append(arch)
    if not used:
        raise NativeBuildError(
            f"nvcc {cuda.release} supports none of TensorFlow's CUDA "
            f"architectures {tf_archs} (set TF_CUDA_COMPUTE_CAPABILITIES)")
    return flags, used


def arch_flags():
    """F16C float16 conversions (6x faster casts) when the build CPU has them.

    `KERAS_LARGEBATCH_NATIVE_CFLAGS` replaces them (e.g. "" for a portable
    build). Rounding is the same either way (round to nearest even).
    """
    if "KERAS_LARGEBATCH_NATIVE_CFLAGS" in os.environ:
        return shlex.split(os.environ["KERAS_LARGEBATCH_NATIVE_CFLAGS"])
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return []
    return ["-mavx", "-mf16c"] if {"avx", "f16c"} <= flags else []


def compile_commands(info, build_temp, output, cuda=None, gencode=()):
    """The compile and link commands, as lists, for `info` from TensorFlow.

    With `cuda` (a `Cuda`), the CUDA kernels are compiled for `gencode` and
    linked with the static CUDA runtime, its symbols kept inside the library.
    """
    cxx = os.environ.get("CXX", "g++")
    tf_cflags = [f for f in info["cflags"] if not f.lstrip("-").startswith("std=")]
    cflags = tf_cflags + [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-I" + ROOT,
        f'-DLB_TF_VERSION="{info["version"]}"',
        "-Wno-deprecated-declarations",
    ] + arch_flags()
    lflags = list(info["lflags"])
    if cuda:
        cflags += ["-DGOOGLE_CUDA=1", "-I" + cuda.include]
        lflags += ["-L" + cuda.libdir, "-l:libcudart_static.a", "-ldl",
                   "-lpthread", "-lrt", "-Wl,--exclude-libs,libcudart_static.a"]
    compiles, objects = [], []
    for source in SOURCES:
        obj = os.path.join(build_temp, os.path.basename(source) + ".o")
        compiles.append([cxx, "-c", os.path.join(ROOT, source), "-o", obj] + cflags)
        objects.append(obj)
    if cuda:
        for source in CUDA_SOURCES:
            obj = os.path.join(build_temp, os.path.basename(source) + ".o")
            compiles.append(
                [cuda.nvcc, "-c", os.path.join(ROOT, source), "-o", obj]
                + tf_cflags + list(gencode)
                + ["-std=c++17", "-O2", "-I" + ROOT, "-DGOOGLE_CUDA=1",
                   "-x", "cu", "-Xcompiler", "-fPIC",
                   "--expt-relaxed-constexpr", "-DNDEBUG"]
            )
            objects.append(obj)
    link = [cxx, "-shared", "-o", output] + objects + lflags + ["-O2"]
    return compiles, link


class BuildNative(build_ext):
    """Compiles the op library with flags from `tf.sysconfig`, or skips it."""

    def get_ext_filename(self, fullname):
        # A plain `.so` name, without the Python ABI suffix: it is a TensorFlow
        # plugin (tf.load_op_library), not a Python extension module.
        filename = super().get_ext_filename(fullname)
        if LIBRARY.endswith(fullname):
            filename = filename[: filename.index("_lb_fusion_ops")] + "_lb_fusion_ops.so"
        return filename

    def build_extensions(self):
        built = []
        for ext in self.extensions:
            if self._build_native(ext):
                built.append(ext)
            elif os.path.exists(self.get_ext_fullpath(ext.name)):
                os.remove(self.get_ext_fullpath(ext.name))  # Stale, from build/.
        self.extensions[:] = built

    def _build_native(self, ext):
        mode = os.environ.get("KERAS_LARGEBATCH_BUILD_NATIVE", "1")
        if mode not in MODES:
            raise SystemExit(
                "keras-largebatch native build: KERAS_LARGEBATCH_BUILD_NATIVE "
                f"must be one of {', '.join(MODES)}. Received: "
                f"KERAS_LARGEBATCH_BUILD_NATIVE={mode!r}")
        if mode == "0":
            _status("skipped (KERAS_LARGEBATCH_BUILD_NATIVE=0): no native ops; "
                    "the TensorFlow backend packs with plain TensorFlow ops "
                    "(JAX and torch use none)")
            return False
        info = query_tensorflow()
        if info is None:
            return self._fail(mode, "no TensorFlow here, so no native ops: "
                              "they serve the TensorFlow backend only, and "
                              "JAX and torch need none (with TensorFlow, "
                              "install it first, then this package)")
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        os.makedirs(self.build_temp, exist_ok=True)
        try:
            cuda, gencode, used = self._cuda(info)
            why_not = None
        except NativeBuildError as e:
            cuda, gencode, used, why_not = None, (), (), str(e)
            if mode == "cuda":
                return self._fail(mode, f"CUDA kernels cannot be built: {e}")
        if cuda:
            try:
                self._compile(*compile_commands(
                    info, self.build_temp, output, cuda, gencode))
                _status(f"CUDA kernels built (nvcc {cuda.release} from "
                        f"{cuda.home}, {','.join(used)}, static cudart) with "
                        f"the CPU kernels, for TensorFlow {info['version']}")
                return True
            except NativeBuildError as e:
                if mode == "cuda":
                    return self._fail(mode, f"CUDA kernels failed to build: {e}")
                why_not = f"the CUDA build failed: {e}"
        try:
            self._compile(*compile_commands(info, self.build_temp, output))
        except NativeBuildError as e:
            return self._fail(mode, f"compiling the native ops failed ({e}); "
                              "installing without them (the TensorFlow "
                              "backend packs with plain TensorFlow ops)")
        _status(f"CUDA kernels NOT built ({why_not}); CPU kernels built for "
                f"TensorFlow {info['version']}")
        return True

    def _cuda(self, info):
        if not info["cuda"]:
            raise NativeBuildError(
                f"TensorFlow {info['version']} is not built with CUDA")
        cuda = find_cuda()
        gencode, used = gencode_flags(cuda, info.get("cuda_archs") or [])
        return cuda, gencode, used

    def _fail(self, mode, message):
        if mode == "cuda":
            raise SystemExit(f"keras-largebatch native build: {message} "
                             "(KERAS_LARGEBATCH_BUILD_NATIVE=cuda)")
        _status(message)
        return False

    def _compile(self, compiles, link):
        try:
            workers = max(1, min(len(compiles), os.cpu_count() or 1))
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(self._run, compiles))
            self._run(link)
        except subprocess.CalledProcessError as e:
            last = (e.stderr or "").strip().splitlines()[-1:] or [""]
            raise NativeBuildError(
                f"{os.path.basename(e.cmd[0])} exited with status "
                f"{e.returncode}: {last[0][:300]}") from None
        except OSError as e:
            raise NativeBuildError(str(e)) from None

    def _run(self, command):
        _log(shlex.join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode:
            _log(result.stderr[-4000:])
            raise subprocess.CalledProcessError(
                result.returncode, command, result.stdout, result.stderr)


setup(
    ext_modules=[Extension(LIBRARY, sources=SOURCES + CUDA_SOURCES, depends=HEADERS)],
    cmdclass={"build_ext": BuildNative},
)
