"""The data sets of `--dataset` live in one table, `data/registry.py`."""

import ast
import os

import numpy as np
import pytest

import keras_largebatch.train
from keras_largebatch.train import config as flags
from keras_largebatch.train.recipe import models
from keras_largebatch.train import data
from keras_largebatch.train.data import loaders
from keras_largebatch.train.data import registry

# The registry's table: the same on every backend.
pytestmark = pytest.mark.backend_independent

PACKAGE = os.path.dirname(keras_largebatch.train.__file__)
DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs",
                    "training.md")


def test_flag_choices_and_help_are_the_registrys():
    flag = flags.BY_NAME["dataset"]
    assert flag.values == registry.NAMES == tuple(
        d.name for d in registry.DATASETS)
    assert flag.help == registry.flag_help()
    for dataset in registry.DATASETS:
        assert dataset.name in flag.help


def test_docs_hold_the_data_set_table_as_the_code_prints_it():
    with open(DOCS) as f:
        page = f.read()
    begin, end = "<!-- datasets:begin -->\n", "<!-- datasets:end -->"
    shown = page[page.index(begin) + len(begin):page.index(end)]
    assert shown == registry.markdown(), (
        "docs/training.md's data-set table is stale: paste the output of "
        "`registry.markdown()` between its markers")


def _names_in(node):
    """The data-set names among a literal's string elements or keys."""
    if isinstance(node, ast.Dict):
        items = node.keys
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    else:
        return set()
    return {item.value for item in items
            if isinstance(item, ast.Constant) and item.value in registry.NAMES}


def test_no_other_module_lists_the_data_sets():
    listed = []
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path == registry.__file__:
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                found = _names_in(node)
                if isinstance(node, ast.Constant) and isinstance(
                        node.value, str):
                    words = {w.strip(" .,;:") for w in node.value.split()}
                    found = words & set(registry.NAMES)
                    found = found if len(found) >= 3 else set()
                if len(found) >= 2:
                    listed.append(f"{os.path.relpath(path, PACKAGE)}:"
                                  f"{node.lineno}: {sorted(found)}")
    assert not listed, (
        "These list data sets by name; read them from "
        "train/data/registry.py instead:\n" + "\n".join(listed))


def test_unknown_name_is_refused_naming_every_entry():
    with pytest.raises(data.DataError, match="imagenet21k") as e:
        registry.load("imagenet21k", 8)
    assert ", ".join(registry.NAMES) in str(e.value)


def _tiny(request):
    rng = np.random.default_rng(request.seed)
    x = rng.random((20, 6, 6, 1), "float32")
    y = np.arange(20) % 2
    return loaders.from_arrays("tiny", x[:16], y[:16], x[16:], y[16:], 2,
                               request.image_size, request.channels)


@pytest.fixture
def with_tiny(monkeypatch):
    tiny = registry.Dataset("tiny", _tiny, "six-pixel noise",
                            native_size=6, augment="light")
    datasets = registry.DATASETS + (tiny,)
    monkeypatch.setattr(registry, "DATASETS", datasets)
    monkeypatch.setattr(registry, "BY_NAME", {d.name: d for d in datasets})
    monkeypatch.setattr(registry, "NAMES", tuple(d.name for d in datasets))
    return tiny


def test_one_entry_adds_a_data_set_everywhere(with_tiny):
    spec = registry.load("tiny", registry.native_size("tiny"), channels=None)
    assert (spec.name, spec.num_train, spec.channels, spec.image_size) == (
        "tiny", 16, 1, 6)
    assert models.image_size_for("resnet_cifar",
                                 registry.native_size("tiny")) == 6
    assert registry.augment_policy("auto", "tiny") == "light"
    assert data.resolve_input_pipeline("grain", "tiny") == "grain"
    assert "tiny: six-pixel noise" in registry.flag_help()
    assert "| `tiny` | 6x6 | light |" in registry.markdown()
