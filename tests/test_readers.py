"""One reader per file kind: damage of any kind is one line naming the file (and line), in the caller's error class,
and no other module parses a file by itself."""

import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from crossbert_model import readers
from crossbert_model.checkpoint import CheckpointError
from crossbert_model.errors import CrossbertError

PACKAGES = [Path(__file__).parent.parent / name for name in ("crossbert_model", "crossbert_eval")]

# Calls that parse a file's content. Each kind has one home; corpora and task data files have readers of their own
# format (they take their bytes from the standard library but nothing else reads those formats).
RAW_PARSES = re.compile(
    r"json\.loads?\(|yaml\.(?:safe_)?load\(|safe_open\(|load_file\(|torch\.load\(|np\.load\("
    r"|\.read_text\(|\.read_bytes\(|read_csv\(|read_parquet\("
)
HOMES = {"crossbert_model/readers.py", "crossbert_model/data/corpus.py", "crossbert_eval/tasks/formats.py"}


def test_no_module_parses_a_file_outside_its_reader():
    offenders = []
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            where = f"{package.name}/{path.relative_to(package)}"
            if where in HOMES:
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if RAW_PARSES.search(line.split("#", 1)[0]):
                    offenders.append(f"{where}:{lineno}: {line.strip()}")
    assert offenders == []


def test_the_hub_variables_are_never_set_by_default():
    """Offline is forced, never defaulted: a value already in the environment must not win."""
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            assert "environ.setdefault" not in path.read_text(), path


def one_line_error(call, error=readers.ReadError) -> str:
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    "content, expected",
    [
        (b'{"a": 1,\n "b": }\n', r"bad.json:2: not valid JSON \(Expecting value, column 7\); expected a test file"),
        (b"[1, 2]", r"bad.json: a JSON array where a test file \(a JSON object\) was expected"),
        (b'{"a": "\xff"}', r"bad.json:1: not utf-8 text \(byte 7\); expected a test file"),
        (b"", r"bad.json:1: not valid JSON"),
    ],
)
def test_json_damage_is_one_line_naming_the_file_and_line(tmp_path, content, expected):
    (tmp_path / "bad.json").write_bytes(content)
    assert re.search(expected, one_line_error(lambda: readers.read_json(tmp_path / "bad.json", "a test file")))


def test_a_missing_file_or_a_folder_is_named_with_what_was_expected(tmp_path):
    assert one_line_error(lambda: readers.read_json(tmp_path / "none.json", "a run's state")).endswith(
        "none.json: missing (expected a run's state)"
    )
    assert "a folder, expected a run's state" in one_line_error(lambda: readers.read_json(tmp_path, "a run's state"))


def test_the_caller_chooses_the_error_class(tmp_path):
    (tmp_path / "config.json").write_text("{")
    one_line_error(lambda: readers.read_json(tmp_path / "config.json", "a model config", CheckpointError), CheckpointError)


@pytest.mark.parametrize(
    "content, expected",
    [
        ("a: 1\nb: [2\n", r"bad.yaml:3: not valid YAML"),
        ("- 1\n- 2\n", r"bad.yaml: expected a mapping at top level \(a test config\), got list"),
        ("a: !!python/object/apply:os.system ['touch pwned']\n", r"bad.yaml:1: not valid YAML"),
    ],
)
def test_yaml_damage_and_object_tags_are_one_line(tmp_path, content, expected):
    (tmp_path / "bad.yaml").write_text(content)
    assert re.search(expected, one_line_error(lambda: readers.read_yaml(tmp_path / "bad.yaml", "a test config")))
    assert not (tmp_path / "pwned").exists()


def test_an_empty_yaml_file_is_an_empty_mapping(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert readers.read_yaml(tmp_path / "empty.yaml", "a config") == {}


def test_jsonl_skips_a_torn_tail_and_names_a_bad_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n{"i": 2')
    assert readers.read_jsonl(path) == [{"i": 0}, {"i": 1}]
    path.write_text('{"i": 0}\n[1]\n{"i": 2}\n')
    assert "rows.jsonl:2: a JSON array, not a row" in one_line_error(lambda: readers.read_jsonl(path))
    path.write_bytes(b'{"i": 0}\n{"i": "\xff"}\n')
    assert "rows.jsonl" in one_line_error(lambda: readers.read_jsonl(path))


def test_truncated_safetensors_are_named_by_every_weights_reader(tmp_path):
    from safetensors.torch import save_file
    import torch

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(4, 4)}, str(path))
    assert readers.safetensors_shapes(path) == {"w": (4, 4)}
    path.write_bytes(path.read_bytes()[:-8])
    for reader in (
        readers.check_safetensors,
        readers.read_safetensors,
        readers.safetensors_shapes,
        lambda p, e: list(readers.safetensors_tensors(p, e)),
    ):
        message = one_line_error(lambda: reader(path, CheckpointError), CheckpointError)
        assert message.startswith(f"{path}: not a readable safetensors file")
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")  # a header length beyond the file
    one_line_error(lambda: readers.read_safetensors(path), readers.ReadError)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_torch_pickle_that_asks_to_run_code_is_refused_and_never_run(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    torch.save({"state": _Payload()}, tmp_path / "optimizer.pt")
    message = one_line_error(lambda: readers.read_torch_pickle(tmp_path / "optimizer.pt", "an optimizer state"))
    assert "a pickle that asks to run code when loaded" in message and "refused" in message
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "torn.pt").write_bytes((tmp_path / "optimizer.pt").read_bytes()[:20])
    assert "truncated or corrupt" in one_line_error(lambda: readers.read_torch_pickle(tmp_path / "torn.pt", "a state"))


@pytest.mark.parametrize(
    "array, rows, expected",
    [
        (np.array([{"a": 1}], dtype=object), None, "not a readable .npy array"),  # pickled objects: never loaded
        (np.ones((3, 2), dtype=np.float32), 4, r"shape \(3, 2\); expected features with 4 rows"),
        (np.array([[1.0, np.nan]]), 1, "holds NaN or Inf"),
        (np.array(["a", "b"]), 2, "holds <U1 values"),
    ],
)
def test_arrays_must_be_finite_numbers_of_the_expected_rows(tmp_path, array, rows, expected):
    path = tmp_path / "x.npy"
    np.save(path, array, allow_pickle=True)
    assert re.search(expected, one_line_error(lambda: readers.read_array(path, "features", rows=rows)))


def test_npz_arrays_are_read_by_name(tmp_path):
    np.savez(tmp_path / "p.npz", y_true=np.arange(3), y_pred=np.arange(3))
    y_true, y_pred = readers.read_arrays(tmp_path / "p.npz", ("y_true", "y_pred"), "predictions")
    assert y_true.tolist() == y_pred.tolist() == [0, 1, 2]
    assert "no array 'probs'" in one_line_error(lambda: readers.read_arrays(tmp_path / "p.npz", ("probs",), "predictions"))
    (tmp_path / "torn.npz").write_bytes((tmp_path / "p.npz").read_bytes()[:30])
    assert "not a readable .npz file" in one_line_error(lambda: readers.read_arrays(tmp_path / "torn.npz", ("y_true",), "x"))


def test_csv_tables(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    assert readers.read_table(tmp_path / "t.csv", "a table").to_dict("records") == [{"a": 1, "b": 2}]
    (tmp_path / "empty.csv").write_text("")
    assert "not a readable CSV table" in one_line_error(lambda: readers.read_table(tmp_path / "empty.csv", "a table"))


def test_a_damaged_feature_cache_file_is_encoded_again(tmp_path):
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.feature_cache import FeatureCache

    minilm = FrozenEncoder.load("minilm", dtype="fp32")
    cache, texts = FeatureCache(tmp_path), ["a first sentence", "and a second one"]
    first = cache.features(minilm, texts, None, [6], ["mean"], "test")[(6, "mean")]
    (cached,) = tmp_path.rglob("*.npy")
    cached.write_bytes(cached.read_bytes()[:60])  # torn by hand: the cache's own writes are atomic
    again = FeatureCache(tmp_path)
    assert np.allclose(again.features(minilm, texts, None, [6], ["mean"], "test")[(6, "mean")], first)
    assert again.misses == 1 and np.load(cached).shape == first.shape


def test_every_reader_error_is_a_crossbert_error():
    assert issubclass(readers.ReadError, CrossbertError)
