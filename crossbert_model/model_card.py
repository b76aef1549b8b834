"""The model card (README.md with the Hugging Face Hub's YAML metadata header) every checkpoint carries.

It says what the checkpoint is from what the run recorded, never retyped: the objective and preset (the run's
config.yaml), parameters by part and training FLOPs per token (crossbert_model.objectives), the corpus with
its source and licence (the data root's MANIFEST.md), tokens seen and training FLOPs (trainer_state.json),
the shared-protocol and validation losses of that step (trainer_state.json's metrics), and, when a results
store holds rows of this checkpoint (`crossbert export`), its probe scores.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import yaml

from .readers import ReadError, read_text
from .run_layout import CheckpointDir
from .config import CrossBertConfig, format_count
from .data.corpus import corpus_location
from .errors import CrossbertError
from .objectives import objective, parameter_counts, training_flops_per_token
from .portable import ST_POOLING, sentence_length
from .train_config import TrainConfig, checkpoint_train_config
from .utils import atomic_write_text

CODE_LICENSE = "MIT"  # this repository's licence (pyproject.toml), which the code files in the folder carry: said in the body
# The weights' terms are the training text's: the corpus licence as the data root's MANIFEST.md words it (after any
# "Wikipedia text:" prefix) -> the Hub's licence id. Wikipedia's text is dual-licensed CC BY-SA 3.0 / GFDL; the Hub
# takes one id, and CC BY-SA is the licence Wikipedia names for reuse. Any other text: `other`, named by the text.
CORPUS_LICENSE_IDS = {
    "CC BY-SA 3.0 / GFDL": "cc-by-sa-3.0",
    "CC BY-SA 3.0": "cc-by-sa-3.0",
    "CC BY-SA 4.0": "cc-by-sa-4.0",
    "CC BY 4.0": "cc-by-4.0",
    "CC BY-NC 4.0": "cc-by-nc-4.0",
}
UNKNOWN_LICENSE = "unknown"  # no MANIFEST row for the corpus: the Hub's id for terms not known
LOSS_PREFIXES = ("shared_loss_r", "val_loss", "val_ppl")


def run_config_of(checkpoint: str | Path) -> TrainConfig | None:
    """The training config of the run a checkpoint folder belongs to, or None when it is not inside one
    (an exported copy) or the config cannot be read here."""
    try:
        return checkpoint_train_config(checkpoint)
    except (CrossbertError, OSError, ValueError):
        return None


def corpus_facts(cfg: TrainConfig | None) -> dict:
    """{'location', 'name', 'source', 'license'} of the training corpus; source and licence from the
    MANIFEST.md beside the corpus folder (the data root's), where it lists it."""
    if cfg is None:
        return {}
    location = corpus_location(cfg.data)
    name = Path(location).name
    facts = {"location": location, "name": name}
    manifest = Path(location).parent / "MANIFEST.md"
    try:
        lines = read_text(manifest, "the data root's MANIFEST.md").splitlines()
    except (ReadError, OSError):  # no manifest (or an unreadable one): the card says where, not under which licence
        return facts
    for line in lines:  # a row of the corpus table: | `name/` | files | format | source | licence | notes |
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1].strip("`").rstrip("/") == name:
            return {**facts, "source": cells[4], "license": cells[5]}
    return facts


def hub_dataset_id(source: str | None) -> str | None:
    """'org/name @ commit : paths' (a MANIFEST source) -> 'org/name' when it starts with a hub dataset id."""
    head = (source or "").split("@")[0].split(":")[0].strip()
    return head if head.count("/") == 1 and " " not in head else None


def weights_license(corpus_license: str | None) -> dict:
    """The card's licence fields for weights trained on a corpus under `corpus_license` (the MANIFEST's words):
    {'license': a Hub id}, or {'license': 'other', 'license_name': the text as an id}; none known: 'unknown'."""
    text = (corpus_license or "").rsplit(":", 1)[-1].strip()
    if not text or text.lower().startswith(("not stated", "unknown")):
        return {"license": UNKNOWN_LICENSE}
    if text in CORPUS_LICENSE_IDS:
        return {"license": CORPUS_LICENSE_IDS[text]}
    words = "".join(c if c.isalnum() or c == "." else " " for c in text.lower()).split()
    return {"license": "other", "license_name": "-".join(words)}


def metadata(config: CrossBertConfig, corpus: dict) -> dict:
    tags = [
        "crossbert",
        f"objective-{config.objective}",
        "feature-extraction",
        "sentence-transformers",
        "custom_code",
        "masked-language-modeling",
    ]
    meta = {
        "library_name": "transformers",
        "pipeline_tag": "feature-extraction",
        **weights_license(corpus.get("license")),
        "tags": tags,
    }
    dataset = hub_dataset_id(corpus.get("source"))
    if dataset:
        meta["datasets"] = [dataset]
    return meta


def _number(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.4f}" if isinstance(value, float) else f"{value:,}"


def losses_section(metrics: dict) -> list[str]:
    keys = sorted(k for k in metrics if k.startswith(LOSS_PREFIXES))
    if not keys:
        return ["No validation or shared-protocol losses were recorded at this step."]
    lines = [
        "Shared protocol (crossbert_model.shared_loss): the same held-out sequences and the same selected",
        "positions for every objective, so these numbers compare across objectives; `val_*` are the",
        "objective's own validation loss.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    return lines + [f"| {k} | {_number(metrics[k])} |" for k in keys]


def probe_score_table(rows: list[dict]) -> list[str]:
    """Main metric per (task, split, probe, features, pooling): the last layer and the best layer, each the mean
    over seeds, from result rows of this checkpoint."""
    by_unit: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("is_main", True) and isinstance(r.get("value"), (int, float)) and r.get("layer") is not None:
            unit = (
                r.get("task"),
                r.get("split"),
                r.get("probe"),
                r.get("feature_transform") or "raw",
                r.get("pooling"),
                r.get("metric"),
            )
            by_unit[unit][int(r["layer"])].append(float(r["value"]))
    lines = [
        "| task | split | probe | features | pooling | metric | last layer | best layer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for unit in sorted(by_unit, key=lambda u: tuple(str(x) for x in u)):
        means = {layer: sum(v) / len(v) for layer, v in by_unit[unit].items()}
        last, best = max(means), max(means, key=means.get)
        lines.append("| " + " | ".join(map(str, unit)) + f" | {means[last]:.4f} (L{last}) | {means[best]:.4f} (L{best}) |")
    return lines


def usage_section(folder_name: str) -> list[str]:
    return [
        "```python",
        "from transformers import AutoModel, AutoTokenizer",
        f'model = AutoModel.from_pretrained("{folder_name}", trust_remote_code=True)  # the encoder; code in this folder',
        f'tokenizer = AutoTokenizer.from_pretrained("{folder_name}", trust_remote_code=True)  # it reads config.json',
        'hidden_states = model(**tokenizer(["a sentence"], return_tensors="pt"), output_hidden_states=True).hidden_states',
        "",
        "from sentence_transformers import SentenceTransformer",
        f'embeddings = SentenceTransformer("{folder_name}", trust_remote_code=True).encode(["a sentence"])  # {ST_POOLING} of the last layer',
        "```",
    ]


def model_card(
    config: CrossBertConfig, trainer_state: dict, run: TrainConfig | None, name: str, probe_rows: list[dict] | None = None
) -> str:
    """The README.md text: YAML header, then what the checkpoint is and how it was trained."""
    corpus = corpus_facts(run)
    counts = parameter_counts(config)
    seq_len = run.data.seq_len if run is not None else config.max_position_embeddings
    preset = run.model.preset if run is not None else "unknown (no run config beside the checkpoint)"
    step = trainer_state.get("step")
    body = [
        f"# {name}" + (f" (step {step})" if step is not None else ""),
        "",
        f"A {objective(config.objective).title} text encoder trained with the CrossBERT harness; preset `{preset}`.",
        "`AutoModel` gives the encoder alone (hidden_states: the embeddings, then every block); the pre-training "
        + ("predictor" if counts["predictor"] else "head")
        + " is in the weights but not used.",
        f"sentence-transformers pools by {ST_POOLING} over real tokens of the last layer, at most {sentence_length(config)} tokens per text.",
        "",
        "## Use (no CrossBERT package needed; the model code is in this folder)",
        "",
        *usage_section(name),
        "",
        "## Model",
        "",
        "| | |",
        "|---|---|",
        f"| objective | {config.objective} (mask ratio {config.mask_ratio:g}"
        + (", complementary masking" if counts["predictor"] and config.complementary_masking else "")
        + ") |",
        f"| preset | {preset} |",
        f"| encoder | {config.num_hidden_layers} layers, width {config.hidden_size}, {config.num_attention_heads} heads, {config.mlp_type} MLP, {config.norm_type} |",
        f"| parameters: encoder | {counts['encoder']:,} ({counts['encoder_non_embedding']:,} non-embedding, {counts['embedding']:,} embedding) |",
        f"| parameters: predictor | {counts['predictor']:,}"
        + (
            f" ({config.predictor_layers} cross-attention blocks, width {config.predictor_hidden_size})"
            if counts["predictor"]
            else ""
        )
        + " |",
        f"| parameters: head | {counts['head']:,} |",
        f"| vocabulary | {config.vocab_size:,} |",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| corpus | {corpus.get('name', 'unknown')}" + (f" ({corpus['source']})" if corpus.get("source") else "") + " |",
        f"| corpus licence | {corpus.get('license', 'unknown')} |",
        f"| steps | {step} of {trainer_state.get('total_steps')} |",
        f"| tokens seen | {trainer_state.get('corpus_tokens', 'unknown'):,} |"
        if "corpus_tokens" in trainer_state
        else "| tokens seen | unknown |",
        f"| sequence length | {seq_len} |",
        f"| training FLOPs per token | {format_count(training_flops_per_token(config, seq_len))} |",
        f"| training FLOPs | {trainer_state['train_flops']:.4g} |"
        if "train_flops" in trainer_state
        else "| training FLOPs | unknown |",
        f"| code revision | {trainer_state.get('git_revision', 'unknown')} |",
        "",
        "## Losses at this step",
        "",
        *losses_section(trainer_state.get("metrics") or {}),
        "",
        "## Frozen probe scores",
        "",
        *(
            probe_score_table(probe_rows)
            if probe_rows
            else ["No probe results for this checkpoint when it was written (`crossbert probe`, then `crossbert export`)."]
        ),
        "",
        "## Licence",
        "",
        f"Training text: {corpus.get('license', 'terms unknown (no MANIFEST.md row for the corpus)')}. The weights carry the "
        f"training text's terms: the header's `license` is `{weights_license(corpus.get('license'))['license']}`. "
        f"Code in this folder: {CODE_LICENSE} (this repository's licence).",
    ]
    header = yaml.safe_dump(metadata(config, corpus), sort_keys=False).strip()
    return f"---\n{header}\n---\n\n" + "\n".join(body) + "\n"


def write_model_card(
    folder: str | Path,
    config: CrossBertConfig,
    trainer_state: dict,
    run: TrainConfig | None,
    name: str,
    probe_rows: list[dict] | None = None,
) -> Path:
    path = CheckpointDir(folder).model_card
    atomic_write_text(path, model_card(config, trainer_state, run, name, probe_rows))
    return path
