"""Shared fixtures. Tests run offline, with every cache in a temporary folder, on the real data root."""

import atexit
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

_CACHE = tempfile.mkdtemp(prefix="crossbert-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)  # each test process leaves no cache behind
os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0",
        "HF_HOME": os.path.join(_CACHE, "hf"),
        "MTEB_CACHE": os.path.join(_CACHE, "mteb"),
        "TOKENIZERS_PARALLELISM": "false",
    }
)

# Each test process of a parallel run (`make test` runs two) gets its share of the cores: OpenMP's default, a thread
# per core in every process, oversubscribes the CPU. Measured on the idle 2-core machine, four test files on two
# processes: 152 s with the default, 117 s with one thread each. Set before torch is first imported, in each worker
# (not in the process that starts them: they would inherit its value); a value the user set is kept.
if "PYTEST_XDIST_WORKER" in os.environ:
    from crossbert_model.utils import core_share  # no torch import (crossbert_model imports lazily)

    os.environ.setdefault("OMP_NUM_THREADS", str(core_share(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import pytest  # noqa: E402

from crossbert_model.data.sequences import prepare_data  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.utils import data_root, quiet_transformers  # noqa: E402

quiet_transformers()

# The suite must pass whether this CPU's bf16 is fast (AVX512-BF16 / AMX) or emulated (AVX2): set
# CROSSBERT_TEST_BF16_SPEEDUP=0.01 (or 3.0) to fake the matmul measurement that `dtype=auto` decides by.
if os.environ.get("CROSSBERT_TEST_BF16_SPEEDUP"):
    from crossbert_model import hardware

    hardware.bf16_speedup = lambda device_str, _value=float(os.environ["CROSSBERT_TEST_BF16_SPEEDUP"]): _value


# The longest test files first. `make test` runs files on two processes (pytest-xdist --dist loadfile), handed out in
# collection order: a long file collected last keeps one process busy while the other idles (alphabetically, test_zoo
# is last). Seconds of test time per file on the 2-core machine, 2026-12-07 (the zoo on its evaluation sample): zoo 73,
# report 73, mteb 71, train 70, probes 45, full_disk 44; the rest under 35. The Makefile passes --no-loadscope-reorder, so xdist
# keeps this order.
LONGEST_FILES_FIRST = (
    "test_zoo.py",
    "test_report.py",
    "test_train.py",
    "test_mteb.py",
    "test_gpu_check.py",
    "test_full_disk.py",
    "test_mteb_layers.py",
    "test_install.py",
    "test_probes.py",
    "test_export.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: each file's tests keep their order


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@dataclass(frozen=True)
class HubCache:
    root: Path  # the folder HF_HUB_CACHE names
    repo_id: str
    revision: str

    def use(self, monkeypatch) -> None:
        """Make this the Hugging Face cache, offline, for the rest of the test (or fixture)."""
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_HUB_CACHE", str(self.root))


@pytest.fixture(scope="session")
def minilm_hub_cache(tmp_path_factory) -> HubCache:
    """A Hugging Face hub cache holding the packaged MiniLM as sentence-transformers/all-MiniLM-L6-v2, in the hub's
    own layout (seed_hub_cache), built once for the run: read it, never write to it."""
    from crossbert_eval.zoo import seed_hub_cache
    from crossbert_model.data.tokenizer import minilm_path

    cache = HubCache(
        tmp_path_factory.mktemp("minilm-hub-cache"),
        "sentence-transformers/all-MiniLM-L6-v2",
        "8b3219a92973c328a8e22fadcfa821b5dc75636a",
    )  # any 40-hex commit id: the cache is keyed by it
    seed_hub_cache(cache.root, cache.repo_id, minilm_path(), cache.revision)
    return cache


@pytest.fixture(scope="session")
def real_data_root():
    """The real data root (../shared/data or $CROSSBERT_DATA_ROOT). Missing data is a failure, not a skip."""
    return data_root()


@pytest.fixture(scope="session")
def corpus_args(real_data_root, tmp_path_factory):
    """The real Wikipedia corpus, first 150 articles, with a small WordPiece vocabulary (fast to build)."""
    return DataArgs(
        corpus=str(real_data_root / "wikipedia_en_2015"),
        vocab_size=2048,
        seq_len=64,
        max_documents=150,
        val_fraction=0.05,
        cache_dir=str(tmp_path_factory.mktemp("data-cache")),
    )


@pytest.fixture(scope="session")
def corpus(corpus_args):
    return prepare_data(corpus_args)


@pytest.fixture(scope="session")
def nano_checkpoint(corpus, tmp_path_factory):
    """`nano_checkpoint(seed, objective="mlm", **config)`: the folder of an untrained nano model (config keys
    override the preset's) saved with the corpus tokenizer, loadable as any checkpoint (FrozenEncoder.load, run_mteb)."""
    import torch

    import crossbert_model as cm

    def make(seed: int, objective: str = "mlm", **config):
        path = tmp_path_factory.mktemp(f"nano-{objective}-{seed}")
        torch.manual_seed(seed)
        preset = cm.config_from_preset("nano", objective=objective, vocab_size=len(corpus.tokenizer), **config)
        cm.pretraining_model_for(preset).save_pretrained(path)
        corpus.tokenizer.save_pretrained(path)
        return path

    return make


@pytest.fixture(scope="session")
def real_batch(corpus):
    """32 real packed sequences, the last 8 padded to varied lengths (as sentence batches are)."""
    import torch

    ids = corpus.train.get(list(range(32)))
    attention = torch.ones_like(ids)
    for row, length in zip(range(24, 32), (5, 9, 17, 23, 31, 40, 51, 63)):
        attention[row, length:] = 0
        ids[row, length:] = corpus.tokenizer.pad_token_id
    return ids, attention
