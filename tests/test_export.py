"""Checkpoints that load anywhere: every checkpoint the trainer saves loads in a process that cannot import this
package, with transformers' AutoModel and with sentence-transformers, and gives the features `crossbert probe`
computes at every layer; it carries a model card with the Hub's metadata header; `crossbert export` writes a
clean copy and refuses what it cannot do in one line."""

import filecmp
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from crossbert_eval.cli import main as cli_main
from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.layer_spec import LayerSpec
from crossbert_model.checkpoint import latest_checkpoint, read_trainer_state
from crossbert_model.errors import USER_ERROR_EXIT
from crossbert_model.objectives import parameter_counts, training_flops_per_token
from crossbert_model.portable import AUTO_MAP, CODE_FILES, package_code_file
from crossbert_model.train import train
from tiny_configs import tiny_train_config

TEXTS = [
    "The cat sat on the mat.",
    "Anarchism is a political philosophy that advocates self-governed societies based on voluntary institutions.",
    "Rain.",
    "A somewhat longer sentence, with commas, numbers like 1939 and a question at the end?",
]
# float32 on the CPU: the same weights and the same tokens, only the padding of a batch differs (one text at a
# time in the fresh process, length-sorted padded batches in crossbert probe, sentence-transformers' own batches)
FEATURE_TOLERANCE = 1e-5
PACKAGES = ("crossbert_model", "crossbert_eval")


@pytest.fixture(scope="module")
def runs(corpus_args, tmp_path_factory):
    """{objective: run folder} of two tiny runs (6 steps of a nano model) trained by the real trainer."""
    out = tmp_path_factory.mktemp("export-runs")
    return {objective: train(tiny_train_config(corpus_args, out, objective)) for objective in ("mlm", "crossbert")}


# The fresh process: a meta-path finder refuses this package's modules before any other finder (the venv's
# editable install included) is asked, it runs outside the repository with no PYTHONPATH, and it proves the
# import fails before it loads anything.
FRESH_PROCESS = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class RefuseCrossbert(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {packages!r}:
                raise ModuleNotFoundError(f"{{name}}: refused in this test process", name=name)
            return None

    sys.meta_path.insert(0, RefuseCrossbert())
    for package in {packages!r}:
        try:
            __import__(package)
            sys.exit(f"{{package}} is importable in the fresh process")
        except ModuleNotFoundError:
            pass

    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    out = {{}}
    for folder in {folders!r}:
        model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # it reads config.json, whose class is in the folder
        layers = []
        with torch.no_grad():
            for text in {texts!r}:
                hidden = model(**tokenizer(text, return_tensors="pt", truncation=True, max_length=128), output_hidden_states=True).hidden_states
                layers.append([h[0].mean(dim=0).tolist() for h in hidden])
        st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
        out[folder] = {{
            "model_class": type(model).__module__ + "." + type(model).__name__,
            "layers": layers,
            "sentence_transformers": st.encode({texts!r}, convert_to_numpy=True).tolist(),
        }}
    out["package_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in {packages!r})
    print(json.dumps(out))
    """
)


def run_without_package(folders: list[Path], tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    script = FRESH_PROCESS.format(packages=PACKAGES, folders=[str(f) for f in folders], texts=TEXTS)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_features(folder: Path) -> dict[int, np.ndarray]:
    """What `crossbert probe` computes: FrozenEncoder (this package), mean pooling, every layer."""
    encoder = FrozenEncoder.load(str(folder))
    layers = encoder.layer_indices(LayerSpec.ALL)
    features = encoder.encode(TEXTS, layers=layers, poolings=["mean"])
    return {layer: features[(layer, "mean")] for layer in layers}


def test_every_saved_checkpoint_loads_without_the_package_with_the_probes_features_at_every_layer(runs, tmp_path):
    """Breaks if: the auto_map or a code file is missing or imports this package; the copied code computes other
    hidden states; sentence-transformers' files pool differently or truncate elsewhere than the probes."""
    folders = [latest_checkpoint(run)[1] for run in runs.values()]
    fresh = run_without_package(folders, tmp_path)
    assert fresh["package_modules"] == []
    for folder in folders:
        got, expected = fresh[str(folder)], probe_features(folder)
        assert got["model_class"].startswith("transformers_modules.") and got["model_class"].endswith(".model.CrossBertModel")
        remote = np.asarray(got["layers"], dtype=np.float32)  # (texts, layers, hidden)
        assert remote.shape[1] == len(expected) == 3  # embeddings + 2 blocks of the nano preset
        for layer, ours in expected.items():
            np.testing.assert_allclose(remote[:, layer], ours, atol=FEATURE_TOLERANCE, rtol=0, err_msg=f"{folder} layer {layer}")
        last = max(expected)
        st = np.asarray(got["sentence_transformers"], dtype=np.float32)
        np.testing.assert_allclose(st, expected[last], atol=FEATURE_TOLERANCE, rtol=0, err_msg=f"{folder} sentence-transformers")


def test_the_code_a_checkpoint_carries_is_the_packages_own_source(runs):
    """Breaks if: the model code is changed in the package but checkpoints carry another copy (or a hand-kept one)."""
    folder = latest_checkpoint(runs["crossbert"])[1]
    for name in CODE_FILES:
        assert filecmp.cmp(folder / name, package_code_file(name), shallow=False), name
    assert json.loads((folder / "config.json").read_text())["auto_map"] == AUTO_MAP


def card_of(folder: Path) -> tuple[dict, str]:
    """(YAML metadata header, Markdown body) of a folder's README.md."""
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_every_checkpoint_carries_a_model_card_with_the_hub_header_and_the_runs_numbers(runs):
    """Breaks if: the card is missing, its header is not the Hub's YAML (or lacks the fields the Hub indexes), or its
    numbers are not those of the run (parameters, tokens, FLOPs, shared-protocol losses)."""
    for objective, run in runs.items():
        folder = latest_checkpoint(run)[1]
        header, body = card_of(folder)
        assert header["library_name"] == "transformers" and header["pipeline_tag"] == "feature-extraction"
        assert (
            header["license"] == "cc-by-sa-3.0" and "crossbert" in header["tags"]
        )  # the weights: the corpus's terms and f"objective-{objective}" in header["tags"]
        assert header["datasets"] == ["jason-feng/wikiVisual"]  # the corpus's source in the data root's MANIFEST.md
        state = read_trainer_state(folder)
        config = FrozenEncoder.load(str(folder)).model.config
        counts = parameter_counts(config)
        assert "| preset | nano |" in body and f"| objective | {objective} " in body
        assert f"| parameters: encoder | {counts['encoder']:,} ({counts['encoder_non_embedding']:,} non-embedding" in body
        assert (
            f"| parameters: predictor | {counts['predictor']:,}" in body and f"| parameters: head | {counts['head']:,} |" in body
        )
        assert f"| tokens seen | {state['corpus_tokens']:,} |" in body and state["corpus_tokens"] == 6 * 8 * 64
        assert f"| training FLOPs | {state['train_flops']:.4g} |" in body
        assert state["train_flops"] == pytest.approx(state["corpus_tokens"] * training_flops_per_token(config, 64))
        shared = {k: v for k, v in state["metrics"].items() if k.startswith("shared_loss_r")}
        assert set(shared) >= {"shared_loss_r15", "shared_loss_r50"}
        for key, value in shared.items():
            assert f"| {key} | {value:.4f} |" in body
        assert "CC BY-SA 3.0 / GFDL |" in next(line for line in body.splitlines() if line.startswith("| corpus licence |"))
        assert "No probe results for this checkpoint" in body  # none at training time


@pytest.fixture(scope="module")
def probed(runs, tmp_path_factory):
    """A results store holding real probe rows (cosine probe on BIOSSES, every layer) of the CrossBERT run's
    latest checkpoint."""
    from crossbert_eval.probe_runner import ProbeSettings, probe_model

    root = tmp_path_factory.mktemp("probed")
    settings = ProbeSettings(
        tasks=["BIOSSES"],
        probes=["cosine"],
        layers=LayerSpec.ALL,
        results_dir=str(root / "results"),
        cache_dir=str(root / "features"),
    )
    probe_model(str(runs["crossbert"]), settings)
    return root / "results"


def crossbert_cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "crossbert_eval.cli", "export", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "CROSSBERT_DEBUG": "0", **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def test_export_of_a_run_writes_a_clean_folder_with_the_probe_scores_in_its_card(runs, probed, tmp_path):
    """Breaks if: training state (optimizer, trainer state, marker) leaks into the export, a run folder does not mean
    its latest checkpoint, the export changes the weights or config (the fingerprint rows carry), or the card leaves
    out the probe scores the results store holds."""
    from crossbert_eval.results import ResultsStore

    run, dest = runs["crossbert"], tmp_path / "exported"
    done = crossbert_cli(str(run), str(dest), "--results", str(probed))
    assert done.returncode == 0, done.stderr
    source = latest_checkpoint(run)[1]
    names = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert not {"optimizer.pt", "trainer_state.json", "COMPLETE"} & set(names) and not [n for n in names if n.startswith(".")]
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "README.md",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        *CODE_FILES,
    } <= set(names)
    for name in ("config.json", "model.safetensors", *CODE_FILES):
        assert filecmp.cmp(dest / name, source / name, shallow=False), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left beside it
    rows = [r for r in ResultsStore(probed).rows() if r.get("is_main")]
    assert len({(r["task"], r["probe"], r["feature_transform"], r["pooling"]) for r in rows}) == 1  # one unit per layer
    assert FrozenEncoder.load(str(dest)).fingerprint == rows[0]["model_fingerprint"]
    _, body = card_of(dest)
    assert "## Frozen probe scores" in body and "No probe results" not in body
    by_layer = {r["layer"]: r["value"] for r in rows}
    best = max(by_layer, key=by_layer.get)
    assert f"| {by_layer[max(by_layer)]:.4f} (L{max(by_layer)}) | {by_layer[best]:.4f} (L{best}) |" in body
    assert "| BIOSSES | test | cosine |" in body
    assert f"exported {source} -> {dest}" in done.stdout


@pytest.mark.parametrize(
    "case",
    ["dest_not_empty", "no_such_source", "run_without_checkpoint", "not_our_checkpoint", "push_offline", "push_bad_id"],
)
def test_export_refusals_are_one_line_exit_2_and_write_nothing(case, runs, tmp_path, monkeypatch, capsys):
    """Breaks if: an export overwrites a folder, reads something that is not one of our checkpoints, or a --push
    offline (this tool's default) writes anything or does not say how to upload."""
    run, dest = runs["mlm"], tmp_path / "out"
    env = {"HF_HUB_OFFLINE": "1"}
    argv = [str(run), str(dest)]
    expected = None
    if case == "dest_not_empty":
        dest.mkdir()
        (dest / "keep.txt").write_text("mine")
        expected = f"{dest}: already exists and is not an empty folder"
    elif case == "no_such_source":
        argv[0] = str(tmp_path / "nope")
        expected = "no such folder"
    elif case == "run_without_checkpoint":
        (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
        argv[0] = str(tmp_path / "empty-run")
        expected = "the run holds no complete checkpoint yet"
    elif case == "not_our_checkpoint":
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
        argv[0] = str(tmp_path / "bert")
        expected = "model_type is 'bert', expected 'crossbert'"
    elif case == "push_offline":
        argv += ["--push", "me/tiny"]
        expected = f"--push me/tiny: offline (HF_HUB_OFFLINE=1), nothing written; export without --push, then upload {dest} when online with `hf upload me/tiny {dest}`"
    elif case == "push_bad_id":
        argv += ["--push", "no-org"]
        env = {"CROSSBERT_ONLINE": "1", "HF_HUB_OFFLINE": "0"}
        expected = "--push 'no-org': expected a Hugging Face Hub id org/name"
    before = sorted(p.name for p in tmp_path.iterdir())
    for key, value in {"CROSSBERT_DEBUG": "0", **env}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as ended:  # the command line in this process (the subprocess path: the test above)
        cli_main(["export", *argv])
    assert ended.value.code == USER_ERROR_EXIT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crossbert export: error: ") and expected in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temporary left
    if case == "dest_not_empty":
        assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def test_the_model_code_checkpoints_carry_imports_nothing_of_the_package_beyond_itself():
    """Breaks if: config.py, model.py or masking.py gain an import (even inside a function, which the fresh-process
    test may not reach) of another module of this package or of a library a plain transformers install lacks."""
    import ast

    allowed = {"__future__", "dataclasses", "math", "numpy", "torch", "transformers"}
    carried = {name.removesuffix(".py") for name in CODE_FILES}
    for name in CODE_FILES:
        for node in ast.walk(ast.parse(package_code_file(name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in carried, f"{name}: from {'.' * node.level}{node.module} import ..."
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in allowed, f"{name}: from {node.module} import ..."
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in allowed for a in node.names), f"{name}: import {[a.name for a in node.names]}"
