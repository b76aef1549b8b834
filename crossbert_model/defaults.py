"""Names and defaults that several commands share, each with this one home (this module imports nothing).

Where the network is concerned (CROSSBERT_ONLINE, the offline variables) see crossbert_model.utils
(`online()`, OFFLINE_ENV); the splits a local mteb task reads: crossbert_eval.tasks.MtebSpec.splits_to_read.
"""

# How a layer's token states become one vector per text (crossbert_eval.encoders.pool).
POOLINGS = ("mean", "cls", "max")

# The frozen probes (crossbert_eval.probes), here so that a command can check a probe's name before anything heavy loads.
PROBES = ("linear", "knn", "cosine")
# The feature transforms of the similarity probes (what each does: crossbert_eval.probes, FEATURE_TRANSFORMS).
FEATURE_TRANSFORM_NAMES = ("raw", "centred", "whitened")

# Compute dtypes a command accepts: `auto` is resolved by crossbert_model.hardware.resolve_dtype.
DTYPES = ("auto", "fp32", "bf16")

# Tokens per text of frozen features when neither the user nor the model says otherwise.
MAX_LENGTH = 128

# Default folders of the evaluation commands: the results store, the feature cache, mteb's run folder.
RESULTS_DIR = "runs/results"
FEATURES_DIR = "runs/features"
MTEB_DIR = "runs/mteb"

# Seconds between rebuilds of a running sweep's or zoo's tables, plots and report (always rebuilt at its end): a
# rebuild draws every plot, ~10-20 s on 2 CPU cores, as long as probing a small model.
REPORT_EVERY_S = 300.0
