"""A build without TensorFlow says in one line that the native ops serve
TensorFlow only, and the package's own packaging raises no deprecation
warning."""

import os
import pathlib
import subprocess
import sys

import pytest

# The wheel's contents: the same on every backend.
pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_build_without_tensorflow_says_jax_and_torch_need_no_native_ops(
        tmp_path):
    # The build asks this interpreter for TensorFlow; /bin/false has none.
    env = dict(os.environ, KERAS_LARGEBATCH_TF_PYTHON="/bin/false")
    proc = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib",
         str(tmp_path / "lib"), "--build-temp", str(tmp_path / "temp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    summary = [line for line in out.splitlines()
               if "UserWarning: keras-largebatch native build:" in line]
    assert len(summary) == 1
    assert "serve the TensorFlow backend only" in summary[0]
    assert "JAX and torch need none" in summary[0]
    assert "fallback" not in out
    assert "deprecat" not in out.lower()
    assert not list((tmp_path / "lib").rglob("*.so"))


def test_every_package_folder_is_listed_for_the_wheel():
    # pyproject lists its packages by hand: a new folder left out installs
    # nowhere, and `pip install .` then fails at import.
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "keras_largebatch").rglob("__init__.py")}
    found |= {"keras_largebatch.applications"}
    assert found == listed
