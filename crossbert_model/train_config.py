"""The training config: its schema (TrainConfig and its sections), its validation, and the one translation
of its model section into a CrossBertConfig (`model_config`).

    cfg = load_config(TrainConfig, "configs/train/tiny_mlm.yaml", ["model.preset=mini"])   # crossbert_model.args
    validate_config(cfg)                                  # ConfigError naming the first bad field
    config = model_config(cfg.model, cfg.data, tokenizer)  # what the trainer trains

The library (shared_loss, the sweep's planning, the benches, the CLI) reads a run's config through this
module, never through the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from .args import ConfigError, diff_dicts, load_config, require
from .data_args import DataArgs
from .defaults import DTYPES
from .limits import (
    FOLDER_NAME_LIMIT,
    FRACTION,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    SEED,
    Check,
    DottedKeys,
    OneOf,
    OutsideDataRoot,
    Range,
    Text,
    check_limits,
    check_relations,
    relation,
)
from .presets import PRESETS
from .run_layout import CheckpointDir
from .tracking import WANDB_MODES, tracking_problem
from .utils import data_root

if TYPE_CHECKING:
    from .config import CrossBertConfig

# The schema above imports no torch or transformers (`crossbert train --help` and `--print-config` read it in a
# fraction of a second); the checks and the translation below import the model modules when they run.


@dataclass
class ModelArgs:
    """The model section: a size preset and the CrossBertConfig fields (same names) a run sets on top of it;
    None keeps the preset's or the objective's default. `model_config` is its one translation."""

    preset: Annotated[str, OneOf(*PRESETS)] = "tiny"  # a size preset (`crossbert presets` lists their shapes)
    objective: Annotated[str, OneOf(lazy="crossbert_model.objectives:objective_names", shown="an objective")] = (
        "mlm"  # a name of crossbert_model.objectives: "mlm" (flat BERT) | "crossbert"
    )
    # the wording CrossBertConfig's own check of it has (crossbert_model.config.check_model_values): no "or null"
    mask_ratio: Annotated[float | None, Range(0, 1, low_open=True, high_open=True, or_null=False)] = (
        None  # default: the objective's (0.15 for mlm, 0.5 for crossbert)
    )
    # Flat MLM corruption of the selected tokens: shares replaced by [MASK] / by a random token; the
    # rest are kept (BERT: 0.8 / 0.1 / 0.1). Pure masking: mlm_mask_prob=1.0 mlm_random_prob=0.0.
    mlm_mask_prob: Annotated[float, FRACTION] = 0.8
    mlm_random_prob: Annotated[float, FRACTION] = 0.1  # share of the selected tokens replaced by a random token (flat MLM)
    complementary_masking: bool = True  # CrossBERT: K = 1/(1 - mask_ratio) disjoint views per sequence (CMS)
    predictor_layers: Annotated[int | None, POSITIVE_INT] = (
        None  # default and width: crossbert_model.config.default_predictor_shape
    )
    predictor_hidden_size: Annotated[int | None, POSITIVE_INT] = (
        None  # the predictor's width (default: crossbert_model.config.default_predictor_shape)
    )
    predictor_heads: Annotated[int | None, POSITIVE_INT] = None  # default: the encoder's head width (crossbert_model.config)
    hidden_size: Annotated[int | None, POSITIVE_INT] = None  # overrides of the preset's shape
    num_hidden_layers: Annotated[int | None, POSITIVE_INT] = None  # encoder blocks (default: the preset's)
    num_attention_heads: Annotated[int | None, POSITIVE_INT] = None  # attention heads (default: the preset's)
    intermediate_size: Annotated[int | None, POSITIVE_INT] = None  # MLP width (default: the preset's)
    mlp_type: Annotated[str, OneOf(lazy="crossbert_model.config:MLP_TYPES", shown="an MLP type")] = "gelu"  # gelu | swiglu
    norm_type: Annotated[str, OneOf(lazy="crossbert_model.config:NORM_TYPES", shown="a norm type")] = (
        "layernorm"  # layernorm | rmsnorm
    )
    # default: the config's initializer_range (0.02); flat MLM's tied logits are scaled to match (model.tied_logit_scale)
    embedding_init_std: Annotated[float | None, POSITIVE] = None
    # CrossBERT: where the predictor gets positions, "rotary" | "encoder" (crossbert_model.config.PREDICTOR_POSITION_ROUTES)
    predictor_positions: Annotated[str, OneOf(lazy="crossbert_model.config:PREDICTOR_POSITION_ROUTES", shown="a route")] = (
        "rotary"
    )
    absolute_positions: bool = False  # learned absolute positions at the encoder's input (the "encoder" route needs them)
    # predicted tokens per chunk of the fused vocabulary head (crossbert_model.model.vocab_cross_entropy_sum); null: full logits
    vocab_chunk_rows: Annotated[int | None, POSITIVE_INT] = 4096

    @relation("mlm_mask_prob", "mlm_random_prob", "predictor_positions", "absolute_positions")
    def _as_the_model_config_checks_them(self, prefix: str) -> None:
        """The shares of a flat MLM's corruption fit in the whole; the "encoder" route needs absolute positions: as
        CrossBertConfig checks them (crossbert_model.config.check_model_values, its one definition; config.py
        raises plain ValueErrors: it travels inside checkpoints without this package)."""
        from .config import check_model_values

        try:
            check_model_values(
                self.mask_ratio,
                self.mlm_mask_prob,
                self.mlm_random_prob,
                self.mlp_type,
                self.norm_type,
                self.embedding_init_std,
                section=prefix,
                predictor_positions=self.predictor_positions,
                absolute_positions=self.absolute_positions,
            )
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass
class OptimArgs:
    lr: Annotated[float, POSITIVE] = 1e-3  # peak learning rate (AdamW)
    weight_decay: Annotated[float, Range(0)] = 0.01  # AdamW decoupled weight decay
    beta1: Annotated[float, Range(0, 1, high_open=True)] = 0.9  # AdamW first-moment decay
    beta2: Annotated[float, Range(0, 1, high_open=True)] = 0.98  # AdamW second-moment decay
    eps: Annotated[float, POSITIVE] = 1e-6  # AdamW epsilon
    warmup_steps: Annotated[int, NON_NEGATIVE_INT] = 100  # linear warm-up from 0 to lr
    schedule: Annotated[str, OneOf("cosine", "linear", "constant")] = "cosine"  # after warm-up
    min_lr_ratio: Annotated[float, FRACTION] = 0.1  # the schedule's final lr, as a share of lr
    grad_clip: Annotated[float, POSITIVE] = 1.0  # max global gradient norm


@dataclass
class TrainConfig:
    name: Annotated[str, FOLDER_NAME_LIMIT] = "run"  # the run folder's name, under out_dir
    out_dir: Annotated[str, OutsideDataRoot()] = "runs"  # where run folders go
    seed: Annotated[int, SEED] = 0  # fixes initialisation, masks and batch order
    steps: Annotated[int, POSITIVE_INT] = 1000  # optimizer steps (unless max_tokens is set)
    max_tokens: Annotated[int | None, POSITIVE_INT] = None  # corpus-token budget; when set it decides `steps`
    batch_size: Annotated[int, POSITIVE_INT] = 32  # sequences per optimizer step, over all processes
    grad_accum: Annotated[int, POSITIVE_INT] = 1  # micro-batches per step (batch_size must be a multiple)
    # autocast dtype; auto is resolved once at the start, config.yaml holds the result
    dtype: Annotated[str, OneOf(*DTYPES)] = "auto"
    log_every: Annotated[int, POSITIVE_INT] = 10  # steps between metrics.jsonl lines
    eval_every: Annotated[int, NON_NEGATIVE_INT] = 200  # steps between validation losses (0: only at checkpoints)
    eval_sequences: Annotated[int, NON_NEGATIVE_INT] = 256  # validation sequences per evaluation
    checkpoint_steps: list[Annotated[int, POSITIVE_INT]] = field(default_factory=list)  # kept for probing along training
    checkpoint_every: Annotated[int, NON_NEGATIVE_INT] = 0  # periodic resume points; the newest KEEP_PERIODIC are kept
    resume: bool = True  # continue from the run folder's latest checkpoint
    distributed: Annotated[str, OneOf("ddp", "fsdp")] = "ddp"  # when launched by torchrun
    num_threads: Annotated[int | None, POSITIVE_INT] = None  # torch CPU threads (default: torch's)
    peak_flops: Annotated[float | None, POSITIVE] = None  # MFU denominator; measured (matmul) when null
    # torch.compile the training forward (the saved model is the same); under FSDP each block is compiled
    # on its own. Off by default: on a 2-core CPU it costs 40-66 s of compilation per model for runs of
    # minutes (bench/cpu_speedups.py), and on GPUs it is measured by bench/gpu_check.py before it becomes
    # a default there.
    compile: bool = False
    # torch.use_deterministic_algorithms for the run's process: a compiled CrossBERT step is otherwise not
    # reproducible run to run on a CPU (two 30-step nano runs from one seed ended at losses 7.39873 and 7.39889;
    # with this set, or eager, bit-identical). Off by default: it constrains kernels (a compiled tiny CrossBERT
    # step ran at 0.84-1.02x the default's speed with it on this CPU: bench/deterministic_cost.py), and on a GPU it also needs CUBLAS_WORKSPACE_CONFIG.
    deterministic: bool = False
    # Recompute each block's activations in the backward instead of keeping them (torch.utils.checkpoint):
    # activation memory for about one more forward of compute, with the same loss and gradients. For
    # models or batches that do not fit otherwise (large presets, long sequences).
    activation_checkpointing: bool = False
    # Defining keys (see NON_DEFINING_KEYS) a resume may change on purpose, e.g. [optim.lr] to continue a
    # diverged run with a lower learning rate. Each accepted change is recorded in run_info.json.
    resume_allow_changes: Annotated[list[str], DottedKeys("crossbert_model.train_config:TrainConfig")] = field(
        default_factory=list
    )
    # Where the scalars of metrics.jsonl also go (crossbert_model.tracking): tensorboard (event files in the run
    # folder) and/or wandb (needs `pip install 'crossbert[tracking]'`); [] writes metrics.jsonl alone.
    tracking: Annotated[list[str], Check(tracking_problem, "tensorboard|wandb")] = field(default_factory=lambda: ["tensorboard"])
    wandb_project: Annotated[str, Text("a W&B project name")] = (
        "crossbert"  # the W&B project the runs are logged to (with wandb in tracking)
    )
    wandb_mode: Annotated[str, OneOf(*WANDB_MODES)] = (
        "offline"  # offline (run files in <run>/wandb; `wandb sync` uploads them) | online
    )
    group: Annotated[str | None, Text("a name")] = None  # the runs this one is compared with (a sweep sets its name): W&B's group
    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def total_steps(self) -> int:
        if self.max_tokens:
            return max(1, math.ceil(self.max_tokens / (self.batch_size * (self.data.seq_len))))
        return self.steps

    @relation("batch_size", "grad_accum")
    def _batch_size_splits_into_micro_batches(self, prefix: str) -> None:
        require(
            self.batch_size % self.grad_accum == 0,
            f"{prefix}batch_size",
            f"a multiple of grad_accum ({self.grad_accum})",
            self.batch_size,
        )

    @relation("model", "data")
    def _the_model_config_builds(self, prefix: str) -> None:
        """What only a built config can refuse (heads that do not divide hidden_size, a ratio CMS cannot realise),
        refused before the run folder exists: the vocabulary (data.vocab_size until the tokenizer is known) changes
        none of it. The trainer builds the config it trains once the tokenizer exists."""
        try:
            model_config(self.model, self.data)
        except ValueError as e:
            raise ConfigError(f"config section 'model': {e}") from None


# Keys that do not change what is trained: a run may be resumed with other values for them.
NON_DEFINING_KEYS = {
    "name",
    "out_dir",
    "resume",
    "log_every",
    "eval_every",
    "eval_sequences",
    "checkpoint_steps",
    "checkpoint_every",
    "num_threads",
    "peak_flops",
    "distributed",
    "data.cache_dir",
    "data.data_root",
    "resume_allow_changes",
    "compile",
    "deterministic",
    "activation_checkpointing",
    "data.num_workers",
    "data.trust_remote_code",
    "tracking",
    "wandb_project",
    "wandb_mode",
    "group",
    "model.vocab_chunk_rows",
}


def defining_changes(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """(dotted key, before, after) for every key of two training configs (as dicts) that changes what is trained:
    what a resume refuses and what makes a committed run another run than the one planned."""
    return [d for d in diff_dicts(before, after) if d[0] not in NON_DEFINING_KEYS]


# --------------------------------------------------------------------------------------------------
# Config validation: every value checked before anything is written, each error names its field. A field's
# limit is declared with the field (crossbert_model.limits; load_config checks them as it loads), what relates
# fields is a @relation method of the class that holds them.
# --------------------------------------------------------------------------------------------------


def validate_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the first bad field. Called before the run folder is touched: every declared limit
    (again, for a config built or changed in code; a typo of a preset is answered before torch loads), then the
    relations between fields, the last of which builds the model config."""
    check_limits(cfg)
    check_relations(cfg)


def model_config(m: ModelArgs, data: DataArgs, tokenizer=None) -> "CrossBertConfig":
    """The one translation of a model section (with the data section's sequence length and vocabulary)
    into a CrossBertConfig: the trainer, the sweep's planning, the benches and the CLI build theirs here.

    With a tokenizer, the vocabulary and special-token ids are the tokenizer's, and a tokenizer that does
    not match is refused. Without one (FLOP planning before any data is prepared) the vocabulary is
    `data.vocab_size`, the size a trained WordPiece is asked for; ids keep their defaults, which do not
    change the shape."""
    from .data.tokenizer import check_tokenizer_matches, special_token_config
    from .objectives import config_from_preset

    shape = {
        k: getattr(m, k)
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "predictor_hidden_size",
            "predictor_heads",
        )
    }
    tokens = special_token_config(tokenizer) if tokenizer is not None else {"vocab_size": data.vocab_size}
    config = config_from_preset(
        m.preset,
        objective=m.objective,
        mask_ratio=m.mask_ratio,
        complementary_masking=m.complementary_masking,
        mlm_mask_prob=m.mlm_mask_prob,
        mlm_random_prob=m.mlm_random_prob,
        predictor_layers=m.predictor_layers,
        mlp_type=m.mlp_type,
        norm_type=m.norm_type,
        embedding_init_std=m.embedding_init_std,
        predictor_positions=m.predictor_positions,
        absolute_positions=m.absolute_positions,
        vocab_chunk_rows=m.vocab_chunk_rows,
        max_position_embeddings=data.seq_len,
        **shape,
        **tokens,
    )
    if tokenizer is not None:
        check_tokenizer_matches(config, tokenizer, f"tokenizer {data.tokenizer!r}")
    return config


def checkpoint_train_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """The TrainConfig of the run a checkpoint folder (runs/<name>/checkpoints/step_N) belongs to, from
    the run's config.yaml (`overrides`: key=value strings as on the command line, e.g.
    ["data.cache_dir=/elsewhere/cache"]), set to read the corpus with the checkpoint's own tokenizer."""
    path = Path(path)
    run = CheckpointDir(path).run
    if run is None or not run.config.is_file():
        where = f"its run's config, {run.config}, was not found" if run else "it is not in a run's checkpoints folder"
        raise ConfigError(f"{path}: expected a checkpoint folder runs/<name>/checkpoints/step_N of a training run ({where})")
    cfg = load_config(TrainConfig, run.config, overrides or [])
    # The checkpoint's own tokenizer, not `data.tokenizer: train` again: today's recipe may train
    # another vocabulary of the same size, whose ids would silently mean other words to this model.
    cfg.data.tokenizer = str(path)
    if "data_root" in cfg.data.corpus:
        cfg.data.data_root = str(data_root(cfg.data.data_root))
    return cfg
