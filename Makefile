# Everything a fresh machine needs: `make demo` (the main job) and `make test`.
# Both create the virtual environment on first use (torch==2.13.0, a CPU wheel, installed first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The data root: crossbert resolves it (CROSSBERT_DATA_ROOT, else ../shared/data beside the checkout);
# `make demo DATA_ROOT=/path` passes another one.
DATA_ROOT ?=
RUNS ?= runs
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 HF_UPDATE_DOWNLOAD_COUNTS=0
ENV := $(OFFLINE) $(if $(DATA_ROOT),CROSSBERT_DATA_ROOT=$(abspath $(DATA_ROOT)))

.PHONY: setup demo demo-quick second-target predictor-positions width-ladder gpu-figure1-data reference test test-all fuzz bench bench-main-job clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

setup: $(VENV)/.installed

# The main job: a small CPU scale sweep (2 sizes x 2 objectives x 3 seeds) on the Wikipedia corpus, probes, plots, report,
# by WORKERS processes on their share of the cores (sweep_workers, below). Resumable: run it again after an
# interruption and it continues where it stopped.
demo: setup
	$(call sweep_workers,configs/sweep/cpu_small.yaml)

# A smoke test of the main job: every stage of `make demo` (tokenizer and token cache, training, probes, geometry, mteb,
# encoder reliance, report) on every objective and size at 2 seeds, 20 steps a run, at most QUICK_LIMIT examples per
# probe split, into $(RUNS)/sweeps/cpu_small-limit$(QUICK_LIMIT): 145 s on the idle 2-core EPYC with the token cache
# built, 169 s from an empty one (2026-12-06). Its numbers mean nothing: its report and verdict say so.
QUICK_LIMIT ?= 200
demo-quick: setup
	$(ENV) $(VENV)/bin/crossbert sweep configs/sweep/cpu_small.yaml --limit $(QUICK_LIMIT) out_dir=$(RUNS)/sweeps train.data.cache_dir=$(RUNS)/cache

# The main job's second target: the same comparison with every run off the unigram plateau, which 30 minutes on
# 2 cores cannot give (2 sizes, tiny and tiny4, x 2 objectives x 3 seeds, 8.0M corpus tokens per run; about 100 minutes
# on 2 cores with native bf16: results/cpu_second_target/README.md). Resumable like the main job.
second-target: setup
	$(ENV) $(VENV)/bin/crossbert sweep configs/sweep/cpu_second_target.yaml out_dir=$(RUNS)/sweeps train.data.cache_dir=$(RUNS)/cache

# Sweeps of several hours, run by WORKERS processes that claim runs from one sweep, each on its share of the cores
# (one process per core: two workers each taking every core ran 2.6x slower per worker on 2 cores, 5.3k against 14k
# tok/s at tiny, 2026-12-06). Resumable: run it again after an interruption. RESTORE=results/<study>: a new sweep folder
# starts from that committed reference and runs only the runs it lacks (docs/sweeps.md).
WORKERS ?= 2
THREADS = $$(( $$(nproc) / $(WORKERS) > 0 ? $$(nproc) / $(WORKERS) : 1 ))
define sweep_workers
	for w in $$(seq $(WORKERS)); do \
	  OMP_NUM_THREADS=$(THREADS) $(ENV) $(VENV)/bin/crossbert sweep $(1) $(if $(RESTORE),--restore $(RESTORE)) \
	    out_dir=$(RUNS)/sweeps train.data.cache_dir=$(RUNS)/cache train.num_threads=$(THREADS) & sleep 5; \
	done; wait
endef

# Where CrossBERT's predictor gets its positions: three routes at tiny x 3 seeds x 8.0M tokens (about 80 minutes with
# two workers on 2 cores; results/predictor_positions/).
predictor-positions: setup
	$(call sweep_workers,configs/sweep/predictor_positions.yaml)

# The first scaling step: nano, tiny, mini x flat MLM and CrossBERT (rotary predictor, std-1.0 draw) x 3 seeds x 8.0M tokens
# (results/cpu_width_ladder/README.md gives the time per stage).
width-ladder: setup
	$(call sweep_workers,configs/sweep/cpu_width_ladder.yaml)

# The data the GPU Figure 1 sweep reads (configs/sweep/gpu_figure1.yaml), in runs/gpu_data: a slice of the data root
# small enough to travel with the checkout (39 MB tracked) to a machine with a GPU within 64 MiB: the first two
# shards of the 40.6M-word Wikipedia sample (20.5 MB, about 11.4M words) and the probe tasks' files, with the pinned
# WordPiece tokenizer (vocabulary 8,192, trained once here on the first shard: every machine reads the same ids).
GPU_DATA := $(RUNS)/gpu_data
gpu-figure1-data: setup
	rm -rf $(GPU_DATA).partial && mkdir -p $(GPU_DATA).partial/wikipedia_en_2015_large $(GPU_DATA).partial/glue $(GPU_DATA).partial/senteval_probing
	$(ENV) $(PY) -c "from crossbert_model.utils import data_root; print(data_root())" > $(GPU_DATA).partial/.root
	R=$$(cat $(GPU_DATA).partial/.root) && \
	cp $$R/MANIFEST.md $(GPU_DATA).partial/ && \
	cp $$R/wikipedia_en_2015_large/wiki_00[0-1].jsonl.xz $(GPU_DATA).partial/wikipedia_en_2015_large/ && \
	cp -r $$R/glue/SST-2 $(GPU_DATA).partial/glue/ && cp -r $$R/stsbenchmark $(GPU_DATA).partial/ && \
	cp $$R/senteval_probing/bigram_shift.* $(GPU_DATA).partial/senteval_probing/
	$(ENV) $(PY) -c "from crossbert_model.data_args import DataArgs; from crossbert_model.data.tokenizer import prepare_tokenizer; \
	  t = prepare_tokenizer(DataArgs(corpus='$(GPU_DATA).partial/wikipedia_en_2015_large/wiki_000.jsonl.xz', tokenizer='train', \
	  vocab_size=8192, seq_len=128, cache_dir='$(RUNS)/cache')); t.save_pretrained('$(GPU_DATA).partial/tokenizer')"
	rm $(GPU_DATA).partial/.root && rm -rf $(GPU_DATA) && mv $(GPU_DATA).partial $(GPU_DATA) && du -sh $(GPU_DATA)

# Copy a sweep's outputs (results store xz-compressed, tables, plots, report; no checkpoints or feature cache) to results/
# as a reference run: `make reference` (the main job) or `make reference SWEEP=sample_efficiency`.
SWEEP ?= cpu_small
# the optional files of a sweep folder its report reads (crossbert_eval/report/loading.py) and its verdict
REPORT_INPUTS := encoder_reliance.jsonl unigram_entropies.jsonl skipped.jsonl summary.json baselines
reference:
	mkdir -p results/$(SWEEP)
	cd $(RUNS)/sweeps/$(SWEEP) && cp -r results tables plots report.md report.html sweep.yaml plan.json checkpoints.jsonl timings.jsonl \
	  $(abspath $(wildcard $(addprefix $(RUNS)/sweeps/$(SWEEP)/,$(REPORT_INPUTS)))) $(CURDIR)/results/$(SWEEP)/
	rm -rf results/$(SWEEP)/results/claims results/$(SWEEP)/baselines/claims   # a running sweep's state, not a result; so are its lock files:
	# kept predictions serve only the paired bootstrap of one-seed comparisons: megabytes a committed reference of
	# several seeds does not need (they stay in the sweep folder); KEEP_PREDICTIONS=1 keeps them
	$(if $(KEEP_PREDICTIONS),,rm -rf results/$(SWEEP)/results/predictions)
	rm -f results/$(SWEEP)/tables/*.parquet   # the CSV tables are the committed data; a report rebuild writes both again
	find results/$(SWEEP) -name '.*.lock' -delete
	xz -9f results/$(SWEEP)/results/results.jsonl   # kept compressed (the report reads results.jsonl.xz)
	xz -9f results/$(SWEEP)/tables/scores.csv       # the largest table, kept compressed too (pandas reads it as it is)

# The test suite CI runs: ruff (lint and format), then everything but the `slow` tier on TEST_WORKERS processes, one
# test file per process at a time (pytest-xdist --dist loadfile: a file's fixtures are built once), the longest files
# first (tests/conftest.py), each process with its share of the cores. Measured on the 2-core EPYC without native bf16,
# 2026-12-07, against the suite before the redesign (6a9460d: 698 tests, one process) in turn on the same machine, two
# pairs: 1,018 tests in 495 s and 434 s by pytest against 648 s and 550 s (wall ratio 0.78 median). Idle, earlier
# that day: 426 s and 459 s (1,011 tests); the old suite took 416 s once, idle, on 2026-12-05.
# `make test-all` adds the slow tier: killed sweeps resumed end to end, the GPU sweep rehearsed on a CPU, MiniLM
# reproducing its published MTEB scores on every exact local task (about 7 more minutes).
TEST_WORKERS ?= 2
PYTEST_ARGS ?=  # more for pytest, e.g. PYTEST_ARGS="--durations=20" or "-k offline"
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-all: setup
	$(ENV) $(PY) -m pytest -q -m "" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The fuzzer's long profile (tests/test_fuzz.py: 400 generated inputs per edge instead of the suite's 25, not
# derandomised); the outcomes per edge are printed at the end.
fuzz: setup
	$(ENV) HYPOTHESIS_PROFILE=fuzz FUZZ_COUNTS=$(RUNS)/fuzz_counts.json $(PY) -m pytest -q tests/test_fuzz.py -p no:cacheprovider
	cat $(RUNS)/fuzz_counts.json

# Speed against named baselines, one run per comparison (about 27 minutes on 2 cores); tables in runs/bench/.
BENCH := $(ENV) $(PY)
bench: setup
	$(BENCH) bench/train_throughput.py --out $(RUNS)/bench --cache-dir $(RUNS)/cache
	$(BENCH) bench/feature_extraction.py --out $(RUNS)/bench
	$(BENCH) bench/knn.py --out $(RUNS)/bench --cache $(RUNS)/features
	$(BENCH) bench/linear_probe.py --out $(RUNS)/bench
	$(BENCH) bench/mteb_stage.py --out $(RUNS)/bench --cache $(RUNS)/features

# The main job timed end to end from a fresh folder (at most 30 minutes on a 2-core CPU with native bf16), per stage.
bench-main-job: setup
	rm -rf $(RUNS)/bench/main_job
	$(BENCH) bench/main_job.py --run-dir $(RUNS)/bench/main_job --out $(RUNS)/bench

clean:
	rm -rf $(RUNS)
