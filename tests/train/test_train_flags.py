"""The flag table is the one source of the command's flags."""

import ast
import dataclasses
import os

import pytest
from absl import flags as absl_flags

from keras_largebatch.train import flags
from keras_largebatch.train import main as train_main
from keras_largebatch.train import resume

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                    "training.md")


def test_docs_hold_the_table_as_the_code_prints_it():
    with open(DOCS) as f:
        page = f.read()
    begin, end = "<!-- flags:begin -->\n", "<!-- flags:end -->"
    shown = page[page.index(begin) + len(begin):page.index(end)]
    assert shown == flags.markdown(), (
        "docs/training.md's flag table is stale: paste the output of "
        "`python -m keras_largebatch.train.flags` between its markers")


def test_parser_resume_and_run_config_come_from_the_table():
    flags.define_flags()
    for flag in flags.TABLE:
        assert absl_flags.FLAGS[flag.name].default == flag.default
    assert resume.FREE is flags.FREE
    assert set(flags.RECORDED) == {f.name for f in flags.TABLE} - {
        "model_dir"}


def _bad_value(flag):
    if flag.minimum is not None:
        return flag.minimum - 1
    valid, _ = flag.valid
    for value in (-1, 0, 1.5, 7, 9):
        value = float(value) if flag.kind == "float" else value
        if not valid(value):
            return value
    raise AssertionError(flag.name)


CHECKED = [f for f in flags.TABLE if f.minimum is not None or f.valid]


@pytest.mark.parametrize("flag", CHECKED, ids=[f.name for f in CHECKED])
def test_each_checked_flag_refuses_a_bad_value_naming_it(flag, tmp_path,
                                                         capsys):
    value = _bad_value(flag)
    code = train_main.main(["prog", f"--{flag.name}={value}",
                            f"--model_dir={tmp_path}/run"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and f"{flag.name}={value}" in err, err
    assert not os.path.exists(tmp_path / "run")


def test_run_config_is_one_frozen_typed_field_per_row(tmp_path):
    fields = dataclasses.fields(flags.RunConfig)
    assert [(f.name, f.type) for f in fields] == [
        (flag.name, flag.type) for flag in flags.TABLE]
    config = train_main.parse(["prog", f"--model_dir={tmp_path}",
                               "--epochs=3"])
    assert (config.epochs, config.model_dir) == (3, str(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 4
    assert all(set(rule.reads) <= flags.BY_NAME.keys()
               for rule in flags.RULES)


def test_only_the_parse_reads_absl_flags_and_functions_stay_short():
    root = os.path.dirname(flags.__file__)
    for folder, _, files in os.walk(root):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                source = f.read()
            if name != "main.py":
                assert "FLAGS[" not in source and "FLAGS." not in source, path
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    assert lines <= 60, f"{path}: {node.name}, {lines} lines"
