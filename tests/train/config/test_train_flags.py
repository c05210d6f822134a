"""Each flag is declared once, as a field of `RunConfig`; the parser, the
checks, `--help`, the docs' table and run_config.json come from it."""

import ast
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
from absl import flags as absl_flags

from keras_largebatch.train.config import batch_schedule
from keras_largebatch.train.config import load
from keras_largebatch.train.run import callbacks as fit_callbacks
from keras_largebatch.train import config as flags
from keras_largebatch.train.config import migration
from keras_largebatch.train.run import driver as train_main
from keras_largebatch._shared import write_json
from keras_largebatch.train.checkpointing import resume

# Flags and their checks: the same on every backend.
pytestmark = pytest.mark.backend_independent

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs",
                    "training.md")


def test_docs_hold_the_table_as_the_code_prints_it():
    with open(DOCS) as f:
        page = f.read()
    begin, end = "<!-- flags:begin -->\n", "<!-- flags:end -->"
    shown = page[page.index(begin) + len(begin):page.index(end)]
    assert shown == flags.markdown(), (
        "docs/training.md's flag table is stale: paste the output of "
        "`python -m keras_largebatch.train.config.help` between its markers")


def test_the_help_module_prints_the_docs_table():
    proc = subprocess.run(
        [sys.executable, "-m", "keras_largebatch.train.config.help"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == flags.markdown()


def test_parser_resume_and_run_config_come_from_the_table():
    flags.define_flags()
    for flag in flags.TABLE:
        assert absl_flags.FLAGS[flag.name].default == flag.default
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
    config = flags.parse(["prog", f"--model_dir={tmp_path}",
                               "--epochs=3", "--momentum=0.8"])
    assert isinstance(config, flags.RunConfig)
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


# `RunConfig`'s parts and fields, in order, with their types, as the
# hand-written classes had them before each flag became its field's
# declaration (the driver and every builder read these names).
FIELDS = {
    "data": "dataset: str, data_dir: str | None, input_pipeline: str, "
            "num_classes: int, num_train_examples: int, "
            "num_validation_examples: int, image_size: int, augment: str, "
            "check_images: bool",
    "network": "model: str, resnet_depth: int, resnet_width: int, "
               "bn_momentum: float, init_weights: str | None",
    "optimization": "optimizer: str, momentum: float, nesterov: bool, "
                    "eta: float, weight_decay: float, label_smoothing: float",
    "learning_rate": "base_learning_rate: float, base_batch_size: int, "
                     "lr_scaling: str, warmup_epochs: float | None, "
                     "end_learning_rate: float, poly_power: float",
    "training": "global_batch_size: int, epochs: int, steps_per_epoch: int, "
                "gradient_accumulation_steps: int",
    "adaptive": "gradient_noise_scale: bool, adaptive_batch: str, "
                "max_global_batch_size: int, adaptive_start_multiple: int, "
                "adaptive_anneal_fraction: float, "
                "adaptive_anneal_multiple: int, noise_scale_multiple: float, "
                "batch_schedule: tuple[tuple[int, int], ...], "
                "adaptive_learning_rate: str",
    "evaluation": "precise_bn_batches: int, evals_per_epoch: int",
    "placement": "fusion_threshold_bytes: int, "
                 "hierarchical_threshold_bytes: int, compression: str, "
                 "topk_density: float, workers_per_node: int, "
                 "collective_timeout_seconds: float, distribution: str",
    "runtime": "precision: str, model_dir: str | None, mode: str, "
               "keep_checkpoints: int, checkpoint_every_steps: int, "
               "seed: int, deterministic: bool, verbose: int | None",
}


def _type_name(annotation):
    return (annotation.__name__ if isinstance(annotation, type)
            else str(annotation))


def test_run_config_keeps_its_parts_fields_order_and_types():
    parts = dataclasses.fields(flags.RunConfig)
    assert [part.name for part in parts] == list(flags.GROUPS)
    shown = {part.name: ", ".join(
        f"{field.name}: {_type_name(field.type)}"
        for field in dataclasses.fields(part.type)) for part in parts}
    for name, fields in FIELDS.items():
        assert shown[name].startswith(fields), name
    for part in parts:
        assert part.type.__dataclass_params__.frozen, part.name
    assert [flag.name for flag in flags.TABLE] == list(
        flags.RunConfig.default().flat())


def test_each_flag_is_one_declared_field_of_its_group():
    for part in dataclasses.fields(flags.RunConfig):
        for field in dataclasses.fields(part.type):
            flag = flags.BY_NAME[field.name]
            assert (flag.group, flag.type) == (part.name, field.type)
            assert field.default == flag.config_default == flag.parse(
                flag.default), field.name
    assert flags.RunConfig.default() == flags.RunConfig.of(
        {flag.name: flag.config_default for flag in flags.TABLE})


# Importing `config/` and answering `--help` with no backend to import
# (each blocked), as `keras-largebatch-train --help` does without one.
_LIGHT = """
import sys
for name in ("tensorflow", "jax", "torch"):
    sys.modules[name] = None
from keras_largebatch.train import cli
import keras_largebatch.train.config
assert cli.main(["prog", "--help"]) == 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in (
    "keras", "tensorflow", "jax", "torch") and sys.modules[m] is not None
    or m.startswith(("keras_largebatch.train.recipe",
                     "keras_largebatch.train.checkpointing")))
print(heavy, file=sys.stderr)
"""


def test_config_and_help_import_no_keras_backend_or_recipe():
    proc = subprocess.run([sys.executable, "-c", _LIGHT],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr
    assert proc.stdout == flags.help_text("keras-largebatch-train") + "\n"


def test_the_commands_help_imports_no_keras_with_a_backend_installed():
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run(
        [sys.executable, "-m", "keras_largebatch.train.cli", "--help"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == flags.help_text("keras-largebatch-train") + "\n"
    imported = {line.rsplit("|", 1)[-1].strip()
                for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "keras_largebatch.train.config" in imported
    assert not imported & {"keras", "tensorflow", "jax", "torch",
                           "keras_largebatch.train.recipe"}


def test_batch_schedule_is_parsed_once_into_epoch_batch_pairs(tmp_path):
    config = flags.parse(
        ["prog", f"--model_dir={tmp_path}", "--epochs=3",
         "--gradient_accumulation_steps=2", "--adaptive_batch=schedule",
         "--batch_schedule=1:64, 2:128"])
    assert config.adaptive.batch_schedule == ((1, 64), (2, 128))
    # run_config.json and the errors write it as the command line does.
    assert config.recorded()["batch_schedule"] == "1:64,2:128"
    assert flags.RunConfig.default().adaptive.batch_schedule == ()
    assert flags.RunConfig.default().recorded()["batch_schedule"] == ""


@pytest.mark.parametrize("text", ["1", "1:", ":64", "one:64", "-1:64",
                                  "1:0", "1:64:2", "1:6.4"])
def test_a_malformed_batch_schedule_is_refused_naming_it(text):
    with pytest.raises(ValueError, match=(
            r"`batch_schedule` must be EPOCH:BATCH,\.\.\. .* Received: "
            rf"batch_schedule='{re.escape(text)}'")):
        batch_schedule.parse("batch_schedule", text)


def test_the_adaptive_batch_builder_takes_the_parsed_schedule():
    adaptive = dataclasses.replace(
        flags.RunConfig.default().adaptive, adaptive_batch="schedule",
        batch_schedule=((0, 32), (1, 64)))
    [callback] = fit_callbacks._adaptive_batch(adaptive, 16)
    assert [tuple(step) for step in callback.schedule] == [(0, 32), (1, 64)]
    source = inspect.getsource(fit_callbacks._adaptive_batch)
    assert "split" not in source and "flags" not in source


def test_the_parts_take_sections_of_the_config_not_all_of_it():
    """Only the driver (run/driver.py), the summary (outputs/report.py)
    and the flags' rules (config/rules.py) hold the whole `RunConfig`; every other function
    names the parts."""
    root = os.path.dirname(os.path.dirname(flags.__file__))  # train/
    for folder, _, files in os.walk(root):
        for name in (f for f in files if f.endswith(".py")):
            if name in ("driver.py", "report.py", "rules.py"):
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
        config = flags.parse(["prog", f"--model_dir={model_dir}",
                                   "--steps_per_epoch=3", *args])
        return dict(config.recorded(), image_size=67, num_classes=10)

    # The same flags, with the adaptive batch's flags of today (`upgrade`).
    write_json(str(tmp_path / "now.json"), recorded("--epochs=1"))
    now = json.loads((tmp_path / "now.json").read_text())
    assert now == migration.upgrade(json.loads(text))
    assert set(now) - set(json.loads(text)) >= {
        "adaptive_start_multiple", "adaptive_anneal_fraction",
        "adaptive_anneal_multiple", "nesterov"}
    record = load.recorded_run(str(model_dir))
    assert record.flags == now
    raised = resume.check(str(model_dir), recorded("--epochs=2"), record,
                          flags.FREE + flags.RAISABLE)
    assert (raised.epochs_before, raised.epochs, raised.raised) == (1, 2,
                                                                    True)
    with pytest.raises(resume.ResumeError, match="`momentum` differs"):
        resume.check(str(model_dir), recorded("--epochs=1", "--momentum=.8"),
                     record, flags.FREE + flags.RAISABLE)
    # A flag newer than the run took its default there.
    with pytest.raises(resume.ResumeError, match="`nesterov` differs"):
        resume.check(str(model_dir), recorded("--epochs=1", "--nesterov"),
                     record, flags.FREE + flags.RAISABLE)


def test_resuming_compares_with_the_run_read_once_with_the_command_line(
        tmp_path, monkeypatch):
    """run_config.json is read once, with the command line
    (`load.parse_run`); the resume check compares with that record and
    refuses a run_config.json written since (by another run)."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    config, record = load.parse_run(["prog", f"--model_dir={model_dir}"])
    assert record is None
    now = dict(config.recorded(), image_size=67, num_classes=10)
    write_json(str(model_dir / "run_config.json"), now)
    with pytest.raises(resume.ResumeError, match="written after this "
                                                 "command read"):
        resume.check(str(model_dir), now, record)
    reads = []
    read = resume.read_run_config
    monkeypatch.setattr(resume, "read_run_config",
                        lambda folder: reads.append(folder) or read(folder))
    config, record = load.parse_run(["prog", f"--model_dir={model_dir}"])
    resumed = resume.check(str(model_dir), now, record, train=False)
    assert resumed.original == record.flags == migration.upgrade(now)
    assert reads == [str(model_dir)]


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
    root = os.path.dirname(os.path.dirname(flags.__file__))  # train/
    for folder, _, files in os.walk(root):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                source = f.read()
            if name != "load.py":
                assert "FLAGS[" not in source and "FLAGS." not in source, path
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    assert lines <= 60, f"{path}: {node.name}, {lines} lines"
