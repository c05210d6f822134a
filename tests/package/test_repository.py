"""The repository keeps one README page, no pointers outside itself and none
of the code issue #11 removed."""

import pathlib

import pytest

# The repository's files: the same on every backend.
pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".pytest_cache"}
TEXT = {".py", ".md", ".json", ".sh", ".toml", ".cfg", ".txt", ".cc", ".h",
        ".yml", ".yaml", ""}


def _text_files():
    """The repository's files: git's list in a checkout (not what tests and
    runs leave behind, such as `.hypothesis/` or `runs/`), else a walk."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
            check=True,
        ).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = None
    if listed is not None:
        for name in filter(None, listed):
            path = ROOT / name
            if path.is_file() and path.suffix in TEXT:
                yield path
        return
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if (path.is_file() and path.suffix in TEXT
                and not SKIP_DIRS.intersection(parts)
                and not any(p.endswith(".egg-info") for p in parts)):
            yield path


def _occurrences(needles, folders=None):
    found = []
    for path in _text_files():
        rel = path.relative_to(ROOT)
        if folders and rel.parts[0] not in folders:
            continue
        text = path.read_text(errors="replace")
        found += [f"{rel}: {n}" for n in needles if n in text]
    return found


def test_readme_fits_in_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_no_reference_to_files_outside_the_repository():
    # Spelled in pieces so that this file does not match itself.
    needles = ["/" + "work/", "MEASURED" + ".md", "design " + "card"]
    assert _occurrences(needles) == []


def test_removed_code_stays_removed():
    needles = ["def " + "compress(", "def " + "decompress(",
               "_keras_largebatch_" + "public_name", "grayscale" + "_digits",
               "def " + "write_atomic", "def " + "_check("]
    assert _occurrences(needles, {"keras_largebatch", "applications",
                                  "bench"}) == []
