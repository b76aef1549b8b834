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
from typing import TYPE_CHECKING

from .args import ConfigError, boolean, folder_name, load_config, non_negative_int, number_in, one_of, positive_int, positive_number, require, to_dict
from .data_args import DataArgs
from .defaults import DTYPES
from .tracking import WANDB_MODES, tracking_problem
from .utils import check_outside_data_root, data_root

if TYPE_CHECKING:
    from .config import CrossBertConfig

# The schema above imports no torch or transformers (`crossbert train --help` and `--print-config` read it in a
# fraction of a second); the checks and the translation below import the model modules when they run.


@dataclass
class ModelArgs:
    """The model section: a size preset and the CrossBertConfig fields (same names) a run sets on top of it;
    None keeps the preset's or the objective's default. `model_config` is its one translation."""

    preset: str = "tiny"  # a size preset of crossbert_model.config.PRESETS (`crossbert presets` lists them)
    objective: str = "mlm"  # a name of crossbert_model.objectives: "mlm" (flat BERT) | "crossbert"
    mask_ratio: float | None = None  # default: the objective's (0.15 for mlm, 0.5 for crossbert)
    # Flat MLM corruption of the selected tokens: shares replaced by [MASK] / by a random token; the
    # rest are kept (BERT: 0.8 / 0.1 / 0.1). Pure masking: mlm_mask_prob=1.0 mlm_random_prob=0.0.
    mlm_mask_prob: float = 0.8
    mlm_random_prob: float = 0.1  # share of the selected tokens replaced by a random token (flat MLM)
    complementary_masking: bool = True  # CrossBERT: K = 1/(1 - mask_ratio) disjoint views per sequence (CMS)
    predictor_layers: int | None = None  # default and width: crossbert_model.config.default_predictor_shape
    predictor_hidden_size: int | None = None
    predictor_heads: int | None = None  # default: the encoder's head width (crossbert_model.config)
    hidden_size: int | None = None  # overrides of the preset's shape
    num_hidden_layers: int | None = None  # encoder blocks (default: the preset's)
    num_attention_heads: int | None = None  # attention heads (default: the preset's)
    intermediate_size: int | None = None  # MLP width (default: the preset's)
    mlp_type: str = "gelu"  # gelu | swiglu
    norm_type: str = "layernorm"  # layernorm | rmsnorm
    # default: the config's initializer_range (0.02); flat MLM's tied logits are scaled to match (model.tied_logit_scale)
    embedding_init_std: float | None = None
    # CrossBERT: where the predictor gets positions, "rotary" | "encoder" (crossbert_model.config.PREDICTOR_POSITION_ROUTES)
    predictor_positions: str = "rotary"
    absolute_positions: bool = False  # learned absolute positions at the encoder's input (the "encoder" route needs them)
    # predicted tokens per chunk of the fused vocabulary head (crossbert_model.model.vocab_cross_entropy_sum); null: full logits
    vocab_chunk_rows: int | None = 4096


@dataclass
class OptimArgs:
    lr: float = 1e-3  # peak learning rate (AdamW)
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.98  # AdamW second-moment decay
    eps: float = 1e-6  # AdamW epsilon
    warmup_steps: int = 100  # linear warm-up from 0 to lr
    schedule: str = "cosine"  # cosine | linear | constant (after warm-up)
    min_lr_ratio: float = 0.1  # the schedule's final lr, as a share of lr
    grad_clip: float = 1.0  # max global gradient norm


@dataclass
class TrainConfig:
    name: str = "run"  # the run folder's name, under out_dir
    out_dir: str = "runs"  # where run folders go
    seed: int = 0  # fixes initialisation, masks and batch order
    steps: int = 1000  # optimizer steps (unless max_tokens is set)
    max_tokens: int | None = None  # corpus-token budget; when set it decides `steps`
    batch_size: int = 32  # sequences per optimizer step, over all processes
    grad_accum: int = 1  # micro-batches per step (batch_size must be a multiple)
    dtype: str = "auto"  # auto | fp32 | bf16 (autocast); auto is resolved once at the start, config.yaml holds the result
    log_every: int = 10  # steps between metrics.jsonl lines
    eval_every: int = 200  # steps between validation losses (0: only at checkpoints)
    eval_sequences: int = 256  # validation sequences per evaluation
    checkpoint_steps: list[int] = field(default_factory=list)  # kept for probing along training
    checkpoint_every: int = 0  # periodic resume points; the newest KEEP_PERIODIC are kept
    resume: bool = True  # continue from the run folder's latest checkpoint
    distributed: str = "ddp"  # ddp | fsdp, when launched by torchrun
    num_threads: int | None = None  # torch CPU threads (default: torch's)
    peak_flops: float | None = None  # MFU denominator; measured (matmul) when null
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
    resume_allow_changes: list[str] = field(default_factory=list)
    # Where the scalars of metrics.jsonl also go (crossbert_model.tracking): tensorboard (event files in the run
    # folder) and/or wandb (needs `pip install 'crossbert[tracking]'`); [] writes metrics.jsonl alone.
    tracking: list[str] = field(default_factory=lambda: ["tensorboard"])
    wandb_project: str = "crossbert"
    wandb_mode: str = "offline"  # offline (run files in <run>/wandb; `wandb sync` uploads them) | online
    group: str | None = None  # the runs this one is compared with (a sweep sets its name): W&B's group
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


# Keys that do not change what is trained: a run may be resumed with other values for them.
NON_DEFINING_KEYS = {
    "name", "out_dir", "resume", "log_every", "eval_every", "eval_sequences", "checkpoint_steps",
    "checkpoint_every", "num_threads", "peak_flops", "distributed", "data.cache_dir", "data.data_root",
    "resume_allow_changes", "compile", "deterministic", "activation_checkpointing", "data.num_workers",
    "data.trust_remote_code", "tracking", "wandb_project", "wandb_mode", "group", "model.vocab_chunk_rows",
}  # fmt: skip


# Seeds: torch.manual_seed takes at most 64 bits, numpy's SeedSequence no negative number.
MAX_SEED = 2**63 - 1


# --------------------------------------------------------------------------------------------------
# Config validation: every value checked before anything is written, each error names its field.
# --------------------------------------------------------------------------------------------------


def check_seed(name: str, value, kind: str = "config field") -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED
    if not ok:
        raise ConfigError(f"{kind} {name!r}: expected an integer from 0 to 2**63 - 1, got {value!r}")


def validate_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the first bad field. Called before the run folder is touched."""
    folder_name("name", cfg.name)  # the run folder is out_dir/name: one segment, inside out_dir
    check_outside_data_root(cfg.out_dir, "config field 'out_dir'")
    check_seed("seed", cfg.seed)
    if cfg.max_tokens is None:
        positive_int("steps", cfg.steps)
    positive_int("max_tokens", cfg.max_tokens, optional=True)
    for name in ("batch_size", "grad_accum", "log_every"):
        positive_int(name, getattr(cfg, name))
    for name in ("eval_every", "eval_sequences", "checkpoint_every"):  # 0: only at checkpoints / none / off
        non_negative_int(name, getattr(cfg, name))
    for i, step in enumerate(cfg.checkpoint_steps):
        positive_int(f"checkpoint_steps[{i}]", step)
    positive_int("num_threads", cfg.num_threads, optional=True)
    positive_number("peak_flops", cfg.peak_flops, optional=True)
    one_of("dtype", cfg.dtype, DTYPES)
    one_of("distributed", cfg.distributed, ("ddp", "fsdp"))
    for name in ("resume", "compile", "deterministic", "activation_checkpointing"):
        boolean(name, getattr(cfg, name))
    require(cfg.batch_size % cfg.grad_accum == 0, "batch_size", f"a multiple of grad_accum ({cfg.grad_accum})", cfg.batch_size)
    _validate_model(cfg.model)
    _validate_data(cfg.data)
    _validate_optim(cfg.optim)
    _check_dotted_keys("resume_allow_changes", cfg.resume_allow_changes, cfg)
    _validate_tracking(cfg)
    # What only a built config can refuse (heads that do not divide hidden_size, a ratio CMS cannot realise)
    # is refused here, before the run folder exists: the vocabulary (data.vocab_size until the tokenizer
    # is known) changes none of it. The trainer builds the config it trains once the tokenizer exists.
    try:
        model_config(cfg.model, cfg.data)
    except ValueError as e:
        raise ConfigError(f"config section 'model': {e}") from None


def _validate_tracking(cfg: TrainConfig) -> None:
    problem = tracking_problem(cfg.tracking)
    require(problem is None, "tracking", problem, cfg.tracking)
    one_of("wandb_mode", cfg.wandb_mode, WANDB_MODES)
    require(isinstance(cfg.wandb_project, str) and cfg.wandb_project.strip(), "wandb_project", "a W&B project name", cfg.wandb_project)
    require(cfg.group is None or (isinstance(cfg.group, str) and cfg.group.strip()), "group", "a name or null", cfg.group)


def _validate_model(m: ModelArgs) -> None:
    from .presets import PRESETS

    one_of("model.preset", m.preset, tuple(PRESETS))  # before the imports below load torch: a typo is answered at once
    from .config import check_model_values
    from .objectives import objective_names

    one_of("model.objective", m.objective, objective_names())
    # the checks CrossBertConfig makes of the same values, named as this file names them (config.py raises plain
    # ValueErrors: it travels inside checkpoints without this package)
    try:
        check_model_values(m.mask_ratio, m.mlm_mask_prob, m.mlm_random_prob, m.mlp_type, m.norm_type, m.embedding_init_std,
                           section="model.", predictor_positions=m.predictor_positions, absolute_positions=m.absolute_positions)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "predictor_layers", "predictor_hidden_size", "predictor_heads", "vocab_chunk_rows"):
        positive_int(f"model.{name}", getattr(m, name), optional=True)


def _validate_data(d: DataArgs) -> None:
    require(isinstance(d.seq_len, int) and d.seq_len >= 3, "data.seq_len", "an integer >= 3 ([CLS] + text + [SEP])", d.seq_len)
    positive_int("data.vocab_size", d.vocab_size)
    number_in("data.val_fraction", d.val_fraction, 0.0, 1.0, False, True)
    positive_int("data.max_documents", d.max_documents, optional=True)
    boolean("data.trust_remote_code", d.trust_remote_code)


def _validate_optim(o: OptimArgs) -> None:
    positive_number("optim.lr", o.lr)
    number_in("optim.weight_decay", o.weight_decay, 0.0, math.inf, False, True)
    number_in("optim.beta1", o.beta1, 0.0, 1.0, False, True)
    number_in("optim.beta2", o.beta2, 0.0, 1.0, False, True)
    positive_number("optim.eps", o.eps)
    non_negative_int("optim.warmup_steps", o.warmup_steps)
    one_of("optim.schedule", o.schedule, ("cosine", "linear", "constant"))
    number_in("optim.min_lr_ratio", o.min_lr_ratio, 0.0, 1.0, False, False)
    positive_number("optim.grad_clip", o.grad_clip)


def _dotted_keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in data.items():
        keys.add(prefix + k)
        if isinstance(v, dict):
            keys |= _dotted_keys(v, f"{prefix}{k}.")
    return keys


def _check_dotted_keys(name: str, keys: list[str], cfg: TrainConfig) -> None:
    valid = _dotted_keys(to_dict(cfg))
    for key in keys:
        if key not in valid:
            raise ConfigError(f"config field {name!r}: expected dotted config keys such as optim.lr, got unknown key {key!r}")


def model_config(m: ModelArgs, data: DataArgs, tokenizer=None) -> "CrossBertConfig":
    """The one translation of a model section (with the data section's sequence length and vocabulary)
    into a CrossBertConfig: the trainer, the sweep's planning, the benches and the CLI build theirs here.

    With a tokenizer, the vocabulary and special-token ids are the tokenizer's, and a tokenizer that does
    not match is refused. Without one (FLOP planning before any data is prepared) the vocabulary is
    `data.vocab_size`, the size a trained WordPiece is asked for; ids keep their defaults, which do not
    change the shape."""
    from .data import check_tokenizer_matches, special_token_config
    from .objectives import config_from_preset

    shape = {k: getattr(m, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "predictor_hidden_size", "predictor_heads")}
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
    config_file = path.parent.parent / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{path}: expected a checkpoint folder runs/<name>/checkpoints/step_N of a training run "
                          f"(its run's config, {config_file}, was not found)")
    cfg = load_config(TrainConfig, config_file, overrides or [])
    # The checkpoint's own tokenizer, not `data.tokenizer: train` again: today's recipe may train
    # another vocabulary of the same size, whose ids would silently mean other words to this model.
    cfg.data.tokenizer = str(path)
    if "data_root" in cfg.data.corpus:
        cfg.data.data_root = str(data_root(cfg.data.data_root))
    return cfg
