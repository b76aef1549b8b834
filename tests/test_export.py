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

from crossbert_eval.encoders import FrozenEncoder
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
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_features(folder: Path) -> dict[int, np.ndarray]:
    """What `crossbert probe` computes: FrozenEncoder (this package), mean pooling, every layer."""
    encoder = FrozenEncoder.load(str(folder))
    layers = encoder.layer_indices("all")
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
