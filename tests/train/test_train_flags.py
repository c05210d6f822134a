"""The flag table is the one source of the command's flags."""

import ast
import dataclasses
import json
import os

import pytest
from absl import flags as absl_flags

from keras_largebatch.train import flags
from keras_largebatch.train import main as train_main
from keras_largebatch.train import outputs
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
        "model_dir", "checkpoint_every_steps"}


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


def test_run_config_is_a_frozen_typed_part_per_group(tmp_path):
    fields = dataclasses.fields(flags.RunConfig)
    assert [(f.name, f.type) for f in fields] == list(flags.CONFIGS.items())
    config = train_main.parse(["prog", f"--model_dir={tmp_path}",
                               "--epochs=3", "--momentum=0.8"])
    assert (config.training.epochs, config.runtime.model_dir,
            config.optimization.momentum) == (3, str(tmp_path), 0.8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.training.epochs = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.training = config.data
    assert list(config.flat()) == [flag.name for flag in flags.TABLE]
    assert config.flat()["epochs"] == 3
    assert all(set(rule.reads) <= flags.BY_NAME.keys()
               for rule in flags.RULES)


def test_each_flag_is_in_exactly_one_group_whose_fields_are_its_flags():
    assert all(flag.group in flags.GROUPS for flag in flags.TABLE)
    assert list(flags.CONFIGS) == list(flags.GROUPS)
    names = []
    for group, made in flags.CONFIGS.items():
        fields = [(f.name, f.type) for f in dataclasses.fields(made)]
        assert fields == [(flag.name, flag.type) for flag in flags.TABLE
                          if flag.group == group], group
        assert fields, f"{group} has no flag"
        assert made.__dataclass_params__.frozen, group
        names += [name for name, _ in fields]
    assert sorted(names) == sorted(flags.BY_NAME)
    assert len(names) == len(set(names)) == len(flags.TABLE)


def test_builders_take_parts_of_the_config_not_all_of_it():
    """Only the driver (main.py), the summary (report.py) and flags.py
    hold the whole `RunConfig`; every other function names the parts."""
    root = os.path.dirname(flags.__file__)
    for folder, _, files in os.walk(root):
        for name in (f for f in files if f.endswith(".py")):
            if name in ("main.py", "report.py", "flags.py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef):
                    params = [a.arg for a in node.args.args
                              + node.args.kwonlyargs]
                    assert "config" not in params, f"{path}: {node.name}"


BEFORE_GROUPS = os.path.join(os.path.dirname(__file__),
                             "run_config_before_groups.json")


def test_a_run_config_json_written_before_the_groups_still_matches(
        tmp_path):
    """run_config_before_groups.json is what the default run with
    --epochs=1 --steps_per_epoch=3 wrote when `RunConfig` was flat."""
    with open(BEFORE_GROUPS) as f:
        text = f.read()
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "run_config.json").write_text(text)

    def recorded(*args):
        config = train_main.parse(["prog", f"--model_dir={model_dir}",
                                   "--steps_per_epoch=3", *args])
        return dict(config.recorded(), image_size=67, num_classes=10)

    # The same flags, with the adaptive batch's flags of today (`upgrade`).
    outputs.write_json(str(tmp_path / "now.json"), recorded("--epochs=1"))
    now = json.loads((tmp_path / "now.json").read_text())
    assert now == resume.upgrade(json.loads(text))
    assert set(now) - set(json.loads(text)) == {
        "adaptive_start_multiple", "adaptive_anneal_fraction",
        "adaptive_anneal_multiple"}
    raised = resume.check(str(model_dir), recorded("--epochs=2"))
    assert (raised.epochs_before, raised.epochs, raised.raised) == (1, 2,
                                                                    True)
    with pytest.raises(resume.ResumeError, match="`momentum` differs"):
        resume.check(str(model_dir), recorded("--epochs=1", "--momentum=.8"))


def test_a_run_saved_before_the_groups_resumes(small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    with open(BEFORE_GROUPS) as f:
        text = f.read()
    (model_dir / "run_config.json").write_text(text)
    assert train_main.main(["prog", f"--model_dir={model_dir}",
                            "--steps_per_epoch=3", "--epochs=2",
                            "--verbose=0"]) == 0
    assert "--epochs raised from 1 to 2" in capsys.readouterr().out
    assert (model_dir / "run_config.json").read_text() == text
    assert os.path.exists(model_dir / "summary.json")


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
