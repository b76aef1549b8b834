"""What a model argument names when it is no local folder: an alias ('minilm') or a Hugging Face hub id, and a hub
id's local snapshot, fetched only when the user opted into the network (CROSSBERT_ONLINE=1).

Light on purpose (huggingface_hub; no torch, no transformers): a command checks a hub id here before the heavy
libraries load, so a model that is not in the local cache is refused in about a second (model_sources resolves the
same id the same way when the model loads).

    repo, revision = hub_id("org/name@v1")      # None when the argument has no hub id's shape
    folder = hub_snapshot(repo, revision)         # HubModelError when offline and not cached
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from crossbert_model.args import did_you_mean
from crossbert_model.errors import CrossbertError
from crossbert_model.utils import online

# org/name, optionally @revision (branch, tag or commit): the shape of a Hugging Face hub model id
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
# a name without an organisation (bert-base-uncased, roberta-base): the hub's legacy ids, still served by redirect
BARE_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
# model names the loader knows without a folder or hub id (a mistyped one gets "did you mean")
MODEL_ALIASES = ("minilm",)
# What a frozen encoder needs from a hub repository: configs (model, tokenizer, sentence-transformers
# modules), vocabularies and safetensors weights; never ONNX/TF/Flax copies or pickles unless allowed.
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.safetensors"]
HUB_PICKLE_PATTERNS = ["pytorch_model*.bin"]
HUB_CODE_PATTERNS = ["*.py"]  # a repository's own code: fetched only when the user trusts it (trust_remote_code)


class EncoderError(CrossbertError, ValueError):
    """A model argument, a model folder or its features that cannot be used: one line naming the model or file.
    Here, with the model names, so the feature cache and the mteb runner refuse without importing torch."""


class HubModelError(CrossbertError, ValueError):
    """A hub id that cannot be had: not cached while offline, no such repository or revision, a refused download."""


def hub_id(spec: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) when `spec` has a hub id's shape (org/name[@revision] or name[@revision])."""
    found = HUB_ID.match(spec) or BARE_HUB_ID.match(spec)
    return (found["repo"], found["revision"]) if found else None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE is set: models come from the local cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_only() -> bool:
    """Hub models come from the local cache only: unless the user opted into the network (CROSSBERT_ONLINE=1), whatever
    the environment holds and whoever calls (a command sets HF_HUB_OFFLINE itself; a library caller may not)."""
    return hub_offline() or not online()


def hub_snapshot(spec: str, allow_pickle: bool = False, trust_remote_code: bool = False) -> Path:
    """The local snapshot of the hub model `spec` names: from the cache when offline, downloaded (only what a frozen
    encoder needs) when online. A bare name close to an alias ('minlm') is said to be one."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    repo_id, revision = hub_id(spec) or (spec, None)
    cache, offline = hub_cache_dir(), cache_only()
    hint = did_you_mean(spec, MODEL_ALIASES) if "/" not in spec else ""  # 'MiniLM-L6' reads as a hub id: say which was meant
    patterns = HUB_PATTERNS + (HUB_PICKLE_PATTERNS if allow_pickle else []) + (HUB_CODE_PATTERNS if trust_remote_code else [])
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline, allow_patterns=patterns)
        return Path(folder)
    except LocalEntryNotFoundError:  # offline (or unreachable hub) and not in the cache
        how = "set CROSSBERT_ONLINE=1 to download it" if offline else "the hub could not be reached; check the connection"
        raise HubModelError(
            f"model {spec!r}: not a local folder, and this hub id is not in the local Hugging Face cache {cache}; "
            f"{how}, or give a local model folder{hint}"
        ) from None
    except RevisionNotFoundError:
        raise HubModelError(f"model {spec!r}: the hub repository {repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise HubModelError(
            f"model {spec!r}: no such model on the Hugging Face hub (or it is private/gated: log in with `hf auth login`){hint}"
        ) from None
    except HfHubHTTPError as e:
        raise HubModelError(f"model {spec!r}: the Hugging Face hub refused the download ({str(e).splitlines()[0]})") from None
