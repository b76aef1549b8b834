"""A plain install (a wheel, not the checkout) works from any folder: its task files ship as package data."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from crossbert_model.utils import data_root

REPO = Path(__file__).resolve().parent.parent
PACKAGE_SOURCES = ("pyproject.toml", "README.md", "crossbert_model", "crossbert_eval", "tasks")


def test_every_package_folder_is_listed_for_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(REPO).parts)
        for name in ("crossbert_model", "crossbert_eval")
        for p in (REPO / name).rglob("__init__.py")
    }
    assert found | {"crossbert_tasks"} == listed


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed (without dependencies: the test's own are used) into a folder
    of its own."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # a copy: setuptools builds in the source tree, and the checkout stays untouched
    source.mkdir()
    for name in PACKAGE_SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / name).is_dir() else {}))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", source], check=True, cwd=root)
    (wheel,) = (root / "dist").glob("crossbert-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", root / "site", wheel], check=True, cwd=root)
    return root / "site"


def crossbert(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "CROSSBERT_DATA_ROOT": str(data_root())}
    env.pop("CROSSBERT_TASKS_DIR", None)
    code = "import crossbert_eval, sys; from crossbert_eval.cli import main; print('from', crossbert_eval.__file__); main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_installed_package_lists_its_tasks_from_another_folder(installed, tmp_path):
    done = crossbert(installed, tmp_path, "tasks")
    assert done.returncode == 0, done.stderr
    assert f"from {installed}" in done.stdout  # the wheel's copy ran, not the checkout
    assert "STSBenchmark" in done.stdout and "BigramShift" in done.stdout and "SST-2" in done.stdout


def test_the_installed_package_probes_a_model_from_another_folder(installed, tmp_path):
    done = crossbert(
        installed,
        tmp_path,
        "probe",
        "minilm",
        "--tasks",
        "BIOSSES",  # 100 pairs, read through the wheel's task file: the smallest task
        "--probe",
        "cosine",
        "--layers",
        "last",
        "--results",
        "out",
    )
    assert done.returncode == 0, done.stderr
    assert f"from {installed}" in done.stdout
    assert not (REPO / "out").exists()
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert {(r["task"], r["probe"]) for r in rows} == {("BIOSSES", "cosine")}
    main_scores = [r["value"] for r in rows if r["is_main"]]
    assert main_scores and all(value > 0.5 for value in main_scores)  # MiniLM scored, not just a file written
