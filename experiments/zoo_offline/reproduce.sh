#!/bin/bash
# The committed offline zoo run (results/zoo_offline/): MiniLM, the same MiniLM by hub id through a
# pre-populated Hugging Face cache (CLS pooling), and two of our trained checkpoints, end to end to the
# report. Run from the repository root with the venv active; no network is used.
set -euo pipefail
# 1. Our two checkpoints: two of the runs of experiments/shared_loss/reproduce.sh (tiny preset, 300 steps x 32 x 128
#    tokens, fp32; ~2-6 min each on 2 cores). Skipped when they exist.
COMMON="steps=300 eval_every=300 checkpoint_steps=[] checkpoint_every=0 batch_size=32 data.seq_len=128 dtype=fp32 num_threads=1 out_dir=runs/shared_loss"
[ -d runs/shared_loss/mlm15_bert_s0/checkpoints ] || crossbert train configs/train/tiny_mlm.yaml $COMMON seed=0 name=mlm15_bert_s0 model.mask_ratio=0.15
[ -d runs/shared_loss/cb50_cms_s0/checkpoints ] || crossbert train configs/train/tiny_crossbert.yaml $COMMON seed=0 name=cb50_cms_s0 \
  model.mask_ratio=0.5 model.complementary_masking=true
# 2. A Hugging Face hub cache holding a copy of the packaged all-MiniLM-L6-v2 as sentence-transformers/all-MiniLM-L6-v2
#    (the hub's own layout: blobs, snapshots/<commit>/, refs/main), so the hub id resolves offline.
export HF_HUB_CACHE="$PWD/runs/zoo/hf-hub-cache"
python -c "import sys; from crossbert_eval.zoo import seed_hub_cache; from crossbert_model.data.tokenizer import minilm_path; \
print(seed_hub_cache(sys.argv[1], 'sentence-transformers/all-MiniLM-L6-v2', minilm_path(), '8b3219a92973c328a8e22fadcfa821b5dc75636a'))" "$HF_HUB_CACHE"
# 3. The zoo (one BLAS / torch thread: the 2-core machine was shared with a training job).
OMP_NUM_THREADS=1 nice -n 19 crossbert zoo configs/zoo/offline_trained.yaml
# 4. What is committed: no feature cache, no mteb cache.
mkdir -p results/zoo_offline/results
cp -r runs/zoo/zoo_offline/{report.md,report.html,zoo.yaml,checkpoints.jsonl,timings.jsonl,plots,tables} results/zoo_offline/
cp runs/zoo/zoo_offline/results/results.jsonl results/zoo_offline/results/
