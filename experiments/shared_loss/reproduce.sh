#!/bin/bash
# The runs of results/shared_loss: 5 objectives x seeds 0, 1, 2 (tiny preset, the default light predictor,
# 300 steps x 32 x 128 tokens, WordPiece 4,096, lr 2e-3 as the main job), one after the other, then the table.
# Run from the repository root in the activated .venv; 0.5-2 min per run on 2 CPU cores.
set -e
COMMON="steps=300 eval_every=300 checkpoint_steps=[] checkpoint_every=0 batch_size=32 data.seq_len=128 data.vocab_size=4096 optim.lr=2e-3 optim.warmup_steps=50 dtype=bf16 out_dir=runs/shared_loss ${EXTRA:-}"
for seed in 0 1 2; do
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm15_bert_s$seed model.mask_ratio=0.15
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm50_bert_s$seed model.mask_ratio=0.5
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm50_pure_s$seed model.mask_ratio=0.5 model.mlm_mask_prob=1.0 model.mlm_random_prob=0.0
  crossbert train configs/train/tiny_crossbert.yaml $COMMON seed=$seed name=cb50_cms_s$seed model.mask_ratio=0.5 model.complementary_masking=true
  crossbert train configs/train/tiny_crossbert.yaml $COMMON seed=$seed name=cb50_nocms_s$seed model.mask_ratio=0.5 model.complementary_masking=false
done
python experiments/shared_loss/make_table.py
