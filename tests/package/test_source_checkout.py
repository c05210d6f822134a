"""Importing from a source checkout, where pip's mapping of applications/
into the package does not exist."""

import pathlib
import shutil
import site
import subprocess
import sys

import pytest

# Imports from a checkout: the same on every backend.
pytestmark = pytest.mark.backend_independent


ROOT = pathlib.Path(__file__).resolve().parents[2]


def _checkout(tmp_path, with_applications=True):
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "keras_largebatch", tmp_path / "keras_largebatch",
                    ignore=ignore)
    if with_applications:
        shutil.copytree(ROOT / "applications", tmp_path / "applications",
                        ignore=ignore)


def _import(tmp_path, code):
    # -S: no .pth files, so no installed or editable keras_largebatch is
    # found; site-packages stays on the path for Keras and its backend.
    path = [str(tmp_path)] + site.getsitepackages()
    script = f"import sys; sys.path[:0] = {path!r}\n{code}"
    return subprocess.run([sys.executable, "-S", "-c", script],
                          capture_output=True, text=True, timeout=300)


def test_applications_load_from_beside_the_package(tmp_path):
    _checkout(tmp_path)
    proc = _import(tmp_path, (
        "import keras_largebatch.applications as a\n"
        "from keras_largebatch.applications import resnet_cifar\n"
        "print(a.__file__); print(resnet_cifar.__file__)"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split()
    assert lines[-2:] == [str(tmp_path / "applications" / "__init__.py"),
                          str(tmp_path / "applications" / "resnet_cifar.py")]


def test_a_checkout_without_applications_says_to_pip_install(tmp_path):
    _checkout(tmp_path, with_applications=False)
    proc = _import(tmp_path, "import keras_largebatch")
    assert proc.returncode != 0
    assert "pip install -e ." in proc.stderr
