#!/bin/bash
# The runs of results/shared_loss: 5 objectives x seeds 0, 1 (tiny preset, 300 steps x 32 x 128 tokens, fp32),
# one after the other, then the table. Run from the repository root; ~2-6 min per run on 2 CPU cores.
set -e
COMMON="steps=300 eval_every=300 checkpoint_steps=[] checkpoint_every=0 batch_size=32 data.seq_len=128 dtype=fp32 num_threads=1 out_dir=runs/shared_loss"
for seed in 0 1; do
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm15_bert_s$seed model.mask_ratio=0.15
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm50_bert_s$seed model.mask_ratio=0.5
  crossbert train configs/train/tiny_mlm.yaml $COMMON seed=$seed name=mlm50_pure_s$seed model.mask_ratio=0.5 model.mlm_mask_prob=1.0 model.mlm_random_prob=0.0
  crossbert train configs/train/tiny_crossbert.yaml $COMMON seed=$seed name=cb50_cms_s$seed model.mask_ratio=0.5 model.complementary_masking=true
  crossbert train configs/train/tiny_crossbert.yaml $COMMON seed=$seed name=cb50_nocms_s$seed model.mask_ratio=0.5 model.complementary_masking=false
done
python results/shared_loss/make_table.py
