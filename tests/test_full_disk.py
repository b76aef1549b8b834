"""The disk fills up in the middle of `crossbert report` and `crossbert export`: one line on stderr naming the file the
command was writing (under the folder it writes to, not a temporary name, not a file it reads, not "a file") and
saying the disk is full, exit 2, no traceback; the previous report (or no report) left exactly as it was, the export's
destination not created, no partial and no temporary file left behind.

The disk (FullDisk): every write into a file under the test's folder goes through it, and it fills at a chosen file:
that file's first write puts half its bytes on the disk and raises ENOSPC naming no file (as write(2) and Python's
file objects do), and every write after it raises too (the disk stays full). It stands in for the lowest writes the
commands use: Python's open / io.open (pandas' csv, matplotlib, PIL, pathlib), os.sendfile (shutil.copyfile of the
weights) and, for pyarrow, which writes a parquet file in C++, DataFrame.to_parquet (half a parquet file, then the
OSError pyarrow raises: ENOSPC, no file named)."""

import builtins
import errno
import io
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from crossbert_eval.cli import main
from crossbert_eval.report import sweep_report
from crossbert_model.errors import USER_ERROR_EXIT
import test_report
from test_cli import _nano_model, run_cli

sweep_root = test_report.sweep_root  # the fixture: a sweep folder of score rows and checkpoints

NO_SPACE = os.strerror(errno.ENOSPC)
WRITE_MODES = frozenset("wax+")


class FullDisk:
    """Writes under `folder` fill the disk at the first write into a file named `fills_at` (or an atomic writer's
    temporary sibling of it, .NAME.*.tmp); `hit`: the path whose write filled it."""

    def __init__(self, folder: Path, fills_at: str, monkeypatch: pytest.MonkeyPatch):
        self.folder, self.fills_at, self.full, self.hit = os.path.realpath(folder), fills_at, False, None
        real_open, real_sendfile, real_to_parquet = builtins.open, os.sendfile, pd.DataFrame.to_parquet

        def fake_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if isinstance(file, (str, os.PathLike)) and WRITE_MODES & set(mode) and self.under(file):
                return FillingFile(f, self, os.fspath(file))
            return f

        def fake_sendfile(out_fd, in_fd, offset, count):
            path = os.readlink(f"/proc/self/fd/{out_fd}")
            if self.under(path) and (self.full or self.fills(path)):
                if not self.full:  # half the file reaches the disk
                    real_sendfile(out_fd, in_fd, offset, max(1, min(count, os.fstat(in_fd).st_size // 2)))
                    self.fill(path)
                raise OSError(errno.ENOSPC, NO_SPACE)
            return real_sendfile(out_fd, in_fd, offset, count)

        def fake_to_parquet(df, path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and self.under(path) and (self.full or self.fills(path)):
                if not self.full:
                    whole = io.BytesIO()
                    real_to_parquet(df, whole, *args, **kwargs)
                    with real_open(path, "wb") as f:
                        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
                    self.fill(os.fspath(path))
                raise OSError(errno.ENOSPC, f"Error writing bytes to file. Detail: [errno {errno.ENOSPC}] {NO_SPACE}")
            return real_to_parquet(df, path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(io, "open", fake_open)  # pathlib's write_text / write_bytes
        monkeypatch.setattr(os, "sendfile", fake_sendfile)  # shutil.copyfile
        monkeypatch.setattr(pd.DataFrame, "to_parquet", fake_to_parquet)

    def under(self, path) -> bool:
        return os.path.realpath(path).startswith(self.folder + os.sep)

    def fills(self, path) -> bool:
        name = os.path.basename(path)
        return name == self.fills_at or (name.startswith(f".{self.fills_at}.") and name.endswith(".tmp"))

    def fill(self, path) -> None:
        self.full, self.hit = True, path


class FillingFile:
    """A file object whose writes go to the real file until the disk is full."""

    def __init__(self, f, disk: FullDisk, path: str):
        self._f, self._disk, self._path = f, disk, path

    def write(self, data):
        if self._disk.full or self._disk.fills(self._path):
            if not self._disk.full:
                self._f.write(data[: len(data) // 2])
                self._f.flush()
                self._disk.fill(self._path)
            raise OSError(errno.ENOSPC, NO_SPACE)
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `folder`."""
    return {p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def assert_one_full_disk_line(err: str, command: str, written: Path) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"crossbert {command}: error: {written}: {NO_SPACE} ("), lines[0]
    assert "the disk is full" in lines[0], lines[0]


# -- crossbert report ------------------------------------------------------------------------------

# The file the disk fills at, and where it lies in the report's folder: each kind of write the report makes.
REPORT_FILES = {
    "summary.csv": "tables/summary.csv",  # pandas' csv
    "summary_by_size.parquet": "tables/summary_by_size.parquet",  # pyarrow
    "collapse.png": "plots/collapse.png",  # matplotlib through PIL
    "collapse.svg": "plots/collapse.svg",  # matplotlib's own writer
    "summary.json": "summary.json",  # the atomic writers (pathlib)
    "report.md": "report.md",
    "report.html": "report.html",  # the last file: everything else is written when the disk fills
}


@pytest.fixture
def one_plot(monkeypatch):
    """The sweep report draws its collapse plot alone (each plot costs seconds; every plot writes the same way)."""
    monkeypatch.setattr(sweep_report, "SWEEP_PLOTS", {"collapse": sweep_report.SWEEP_PLOTS["collapse"]})


@pytest.fixture(scope="module")
def reported_sweep(tmp_path_factory):
    """A sweep folder with its complete report (collapse plot alone), built once; each test works on a copy."""
    root = test_report.write_sweep_rows(tmp_path_factory.mktemp("reported"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep_report, "SWEEP_PLOTS", {"collapse": sweep_report.SWEEP_PLOTS["collapse"]})
        main(["report", str(root)])
    return root


@pytest.fixture(scope="module")
def reported_store(tmp_path_factory):
    """A results folder (a probe run's --results) with its complete report, built once; each test works on a copy."""
    store = _store_of(test_report.write_sweep_rows(tmp_path_factory.mktemp("store")))
    main(["report", str(store)])
    return store


def _rescored(root: Path) -> None:
    """New scores, so that a new report differs from the previous one in every table, plot and page."""
    path = root / "results" / "results.jsonl" if (root / "results").is_dir() else root / "results.jsonl"
    path.write_text(path.read_text().replace('"value": 0.', '"value": 0.1'))


@pytest.mark.parametrize("fills_at", list(REPORT_FILES))
def test_a_full_disk_mid_report_names_the_file_and_keeps_the_previous_report_whole(
    fills_at, reported_sweep, one_plot, tmp_path, monkeypatch, capsys
):
    """Breaks if: a report file is written in place (a half-written table, plot or page, or a new table beside the
    previous page), a temporary file stays behind, or the line names no file, a temporary name or a file read."""
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    root = Path(shutil.copytree(reported_sweep, tmp_path / "sweep"))  # the previous report, complete
    assert (root / "report.html").is_file() and (root / "plots" / "collapse.svg").is_file()
    _rescored(root)
    before = snapshot(root)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        disk = FullDisk(root, fills_at, patch)
        code, err = run_cli(["report", str(root)], capsys)
    assert disk.hit is not None, f"no write into {fills_at}"
    assert code == USER_ERROR_EXIT, err
    assert_one_full_disk_line(err, "report", root / REPORT_FILES[fills_at])
    assert snapshot(root) == before  # every previous file as it was; no partial, new or temporary file


def test_a_full_disk_mid_first_report_leaves_no_report_at_all(sweep_root, one_plot, monkeypatch, capsys):
    """Breaks if: the tables and plots of a report that could not be finished are left in the folder (a report
    without its page), or anything else is."""
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    before = snapshot(sweep_root)
    with pytest.MonkeyPatch.context() as patch:
        disk = FullDisk(sweep_root, "report.html", patch)
        code, err = run_cli(["report", str(sweep_root)], capsys)
    assert disk.hit is not None
    assert code == USER_ERROR_EXIT, err
    assert_one_full_disk_line(err, "report", sweep_root / "report.html")
    assert snapshot(sweep_root) == before


def _store_of(sweep: Path) -> Path:
    """A results folder (a probe run's --results) of the sweep's final checkpoints, each row naming its model."""
    store = sweep / "store"
    rows = [json.loads(line) for line in (sweep / "results" / "results.jsonl").read_text().splitlines()]
    rows = [{**r, "model": r["model_fingerprint"].rsplit("-", 2)[0]} for r in rows if r["model_fingerprint"].endswith("-100")]
    store.mkdir()
    (store / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return store


@pytest.mark.parametrize("fills_at", ["layers.csv", "layers.png"])
def test_a_full_disk_mid_results_store_report_names_the_file_and_keeps_the_previous_report(
    fills_at, reported_store, tmp_path, monkeypatch, capsys
):
    """`crossbert report` of any results folder (the store report): the same."""
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    store = Path(shutil.copytree(reported_store, tmp_path / "store"))
    assert (store / "report.md").is_file() and (store / "tables" / "layers.csv").is_file()
    _rescored(store)
    before = snapshot(store)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        disk = FullDisk(store, fills_at, patch)
        code, err = run_cli(["report", str(store)], capsys)
    assert disk.hit is not None
    assert code == USER_ERROR_EXIT, err
    assert_one_full_disk_line(err, "report", store / ("tables" if fills_at.endswith(".csv") else "plots") / fills_at)
    assert snapshot(store) == before


def test_a_report_after_a_full_disk_is_whole(sweep_root, one_plot, monkeypatch, capsys):
    """What a full disk left never blocks the next report: once there is room, the same command writes it all."""
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    with pytest.MonkeyPatch.context() as patch:
        FullDisk(sweep_root, "collapse.png", patch)
        assert run_cli(["report", str(sweep_root)], capsys)[0] == USER_ERROR_EXIT
    main(["report", str(sweep_root)])
    assert (sweep_root / "report.html").is_file() and (sweep_root / "plots" / "collapse.png").stat().st_size > 1000
    assert not [p for p in sweep_root.rglob(".*")], "a temporary file or folder stayed"


# -- crossbert export ------------------------------------------------------------------------------


@pytest.mark.parametrize("fills_at", ["model.safetensors", "model.py", "README.md", "modules.json"])
def test_a_full_disk_mid_export_names_the_destination_file_and_writes_nothing(fills_at, tmp_path, monkeypatch, capsys):
    """Breaks if: the line names the file copied from (shutil.copyfile names its source first), the export's
    temporary folder, or no file; or a partial export, or its temporary folder, stays behind."""
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    source = Path(_nano_model(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    before_source, before_out = snapshot(source), snapshot(out)
    dest = out / "exported"
    with pytest.MonkeyPatch.context() as patch:
        disk = FullDisk(out, fills_at, patch)
        code, err = run_cli(["export", str(source), str(dest)], capsys)
    assert disk.hit is not None, f"no write into {fills_at}"
    assert code == USER_ERROR_EXIT, err
    assert_one_full_disk_line(err, "export", dest / fills_at)
    assert not dest.exists() and snapshot(out) == before_out  # no partial export, no temporary folder
    assert snapshot(source) == before_source


@pytest.mark.parametrize("is_dir", [False, True])
def test_every_atomic_write_names_its_target_not_its_temporary_sibling(tmp_path, is_dir):
    """The class behind the export's and the checkpoint's wrong names: a write into the temporary sibling (or a copy
    into it, which names the destination second, as shutil.copyfile does) is reported at the place it would land."""
    from crossbert_model.utils import atomic_path

    target = tmp_path / ("checkpoint" if is_dir else "summary.json")
    with pytest.raises(OSError) as caught:
        with atomic_path(target, is_dir=is_dir) as tmp:
            inside = tmp / "model.py" if is_dir else tmp
            raise OSError(errno.ENOSPC, NO_SPACE, "/source/model.py", None, str(inside))
    assert caught.value.filename2 == str(target / "model.py" if is_dir else target)
    assert caught.value.filename == "/source/model.py" and not target.exists() and list(tmp_path.iterdir()) == []
