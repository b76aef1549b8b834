"""The training step an accelerator runs without waiting for the device.

Two views of "no host-device synchronisation": the models' forward and backward run on the `meta`
device, where any data-dependent operation (`.item()`, `bool(tensor)`, boolean indexing, a shape read
from the data) raises; and the trainer's step, between logging points, calls none of the methods
that read a tensor back to the host.
"""

import contextlib

import pytest
import torch

import crossbert_model as cm
from crossbert_model.masking import RowRandom, crossbert_packing, mlm_targets
from crossbert_model.objectives import objective_names, pretraining_batch
from crossbert_model.train import Trainer, make_optimizer, prepared_ahead
from tiny_configs import tiny_train_config

READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


def nano(objective, **kw):
    return cm.config_from_preset("nano", objective=objective, vocab_size=2048, **kw)


def packed_batch(config, corpus, rows=8, step=0):
    ids = corpus.train.get(list(range(rows)))
    return pretraining_batch(ids, torch.ones_like(ids), config, RowRandom(step))


OBJECTIVES = {
    "mlm15": dict(objective="mlm", mask_ratio=0.15),
    "crossbert_cms_r50": dict(objective="crossbert", mask_ratio=0.5, complementary_masking=True),
    "crossbert_cms_r75": dict(objective="crossbert", mask_ratio=0.75, complementary_masking=True),
    "crossbert_nocms": dict(objective="crossbert", mask_ratio=0.5, complementary_masking=False),
}
# Every registered objective runs these checks: at its defaults where the table above names none of its variants.
OBJECTIVES |= {
    name: dict(objective=name) for name in objective_names() if name not in {v["objective"] for v in OBJECTIVES.values()}
}


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_packed_batches_need_no_mask_and_no_validity(corpus, name):
    """Packed sequences (no padding) with K dividing the length: every data-dependent shape is uniform,
    so the batch carries no mask at all and the models take SDPA's unmasked kernels."""
    batch = packed_batch(nano(**OBJECTIVES[name]), corpus)
    assert batch["attention_mask"] is None
    validity = [k for k in ("target_valid", "encoder_valid", "query_valid") if k in batch]
    assert validity and all(batch[k] is None for k in validity)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_forward_and_backward_run_on_the_meta_device(corpus, name):
    """On `meta` a tensor has no values: any read of the data (a synchronisation on a GPU) raises."""
    config = nano(**OBJECTIVES[name])
    batch = packed_batch(config, corpus)
    batch.pop("visible", None)  # what the trainer sends is enough; the views live in the packing
    with torch.device("meta"):
        model = cm.pretraining_model_for(config)
    meta = {k: None if v is None else v.to("meta") for k, v in batch.items()}
    if "encoder_positions" in batch:  # the views' shape, which the packing holds
        meta["visible"] = torch.empty(
            batch["encoder_positions"].shape[:2] + (batch["input_ids"].shape[1],), dtype=torch.bool, device="meta"
        )
    out = model(**meta)
    out.loss_sum.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert out.logits.shape == (out.labels.shape[0], config.vocab_size)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_host_packing_gives_the_loss_the_model_computes_itself(corpus, name):
    config = nano(**OBJECTIVES[name])
    batch = packed_batch(config, corpus)
    torch.manual_seed(0)
    model = cm.pretraining_model_for(config).eval()
    packing_keys = ("target_positions", "target_valid", "encoder_positions", "encoder_valid", "query_positions", "query_valid")
    bare = {k: v for k, v in batch.items() if k not in packing_keys}
    with torch.no_grad():
        a, b = model(**batch), model(**bare)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.labels, b.labels) and int(a.num_predicted) == int(b.num_predicted)


def test_padded_batches_keep_their_masks_and_predict_only_real_tokens(real_batch):
    ids, attention = real_batch
    labels = torch.where(attention.bool(), ids, torch.full_like(ids, -100))
    assert mlm_targets(labels)["target_valid"] is not None
    visible = torch.zeros(ids.shape[0], 1, ids.shape[1], dtype=torch.bool)
    visible[:, 0, ::2] = True
    packing = crossbert_packing(visible & attention.bool().unsqueeze(1), attention)
    assert packing["query_valid"] is not None
    assert int(packing["query_valid"].sum()) == int((attention.bool() & ~visible[:, 0]).sum())


@contextlib.contextmanager
def counting_reads():
    """Count calls that copy a tensor's value to the host, and boolean-mask indexing (data-dependent shape)."""
    calls = []
    originals = {name: getattr(torch.Tensor, name) for name in READS + ("__getitem__",)}

    def counted(name):
        def wrapper(self, *args, **kwargs):
            calls.append(name)
            return originals[name](self, *args, **kwargs)

        return wrapper

    def getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(torch.is_tensor(p) and p.dtype == torch.bool for p in parts):
            calls.append("boolean index")
        return originals["__getitem__"](self, index)

    try:
        for name in READS:
            setattr(torch.Tensor, name, counted(name))
        torch.Tensor.__getitem__ = getitem
        yield calls
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.parametrize("objective", objective_names())
def test_the_trainer_step_reads_nothing_back_between_logging_points(corpus_args, tmp_path, objective):
    cfg = tiny_train_config(corpus_args, tmp_path, objective, steps=4, grad_accum=2)
    trainer = Trainer(cfg)
    # What an accelerator runs: no per-step read, and the fused AdamW, whose step counters live beside the
    # parameters (the CPU's default AdamW keeps them on the host and reads them there, which is free).
    trainer.read_every_step = False
    trainer.optimizer = make_optimizer(trainer.model, cfg.optim, torch.device("cuda"))
    assert trainer.optimizer.defaults["fused"]
    batches = [trainer.host_batch(step) for step in range(2)]  # prepared on the host: reading there is free
    with counting_reads() as calls:
        out = trainer.train_step(0, batches[0], read=False)
    assert calls == [], f"the step read from the device: {sorted(set(calls))}"
    assert torch.is_tensor(out["loss"]) and torch.isfinite(out["loss"])
    with counting_reads() as calls:  # at a logging point the step does read (the counter works)
        trainer.train_step(1, batches[1], read=True)
    assert "__float__" in calls


def test_batches_prepared_ahead_arrive_in_step_order():
    made = []

    def make(step):
        made.append(step)
        return {"step": step}

    assert [b["step"] for b in prepared_ahead(make, range(3, 10), depth=3)] == list(range(3, 10))
    assert sorted(made) == list(range(3, 10))
