"""The fused, chunked vocabulary head (crossbert_model.model.vocab_cross_entropy_sum): the same loss and gradients as
full logits + cross-entropy, in fp32 exactly (to float rounding) and under bf16 autocast within bf16's tolerance, for
both objectives' models."""

import pytest
import torch
import torch.nn.functional as F

import crossbert_model as cm
from crossbert_model.masking import RowRandom, crossbert_views, mlm_masking
from crossbert_model.model import vocab_cross_entropy_sum


def _leaves(n=1000, d=32, v=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, w, b = (torch.randn(*shape, generator=g).requires_grad_() for shape in ((n, d), (v, d), (v,)))
    return h, w, b, torch.randint(0, v, (n,), generator=g)


def _loss_and_grads(fn, h, w, b, y):
    for t in (h, w, b):
        t.grad = None
    loss = fn(h, w, b, y)
    (3.0 * loss).backward()  # a non-unit upstream gradient: the backward must scale by it
    return loss.detach(), [t.grad.clone() for t in (h, w, b)]


def unfused(h, w, b, y):
    return F.cross_entropy(F.linear(h, w, b).float(), y, reduction="sum")


@pytest.mark.parametrize("chunk_rows", [1, 128, 999, 4096])
def test_the_chunked_head_gives_the_unfused_loss_and_gradients_in_fp32(chunk_rows):
    h, w, b, y = _leaves()
    ref_loss, ref_grads = _loss_and_grads(unfused, h, w, b, y)
    loss, grads = _loss_and_grads(lambda *a: vocab_cross_entropy_sum(*a, chunk_rows), h, w, b, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-3)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)  # float rounding of differently ordered sums


def test_under_bf16_autocast_the_chunked_head_is_as_close_to_fp32_as_the_unfused_one():
    """bf16 rounds the logits (about 3 significant digits) in both heads; what the chunked head must not do is add
    error: against the fp32 values, its loss and gradients are no further off than the unfused head's."""
    h, w, b, y = _leaves(d=16)
    exact_loss, exact_grads = _loss_and_grads(unfused, h, w, b, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grads = _loss_and_grads(unfused, h, w, b, y)
        loss, grads = _loss_and_grads(lambda *a: vocab_cross_entropy_sum(*a, 256), h, w, b, y)
    assert loss.dtype == torch.float32  # logits and sums in fp32
    assert abs(float(loss - exact_loss)) <= 1.5 * abs(float(ref_loss - exact_loss)) + 1e-3 * float(exact_loss)
    for got, want, exact in zip(grads, ref_grads, exact_grads):
        assert got.dtype == want.dtype == torch.float32  # the leaves' own dtype
        assert float((got - exact).abs().mean()) <= 1.5 * float((want - exact).abs().mean()) + 1e-6


def test_without_gradients_no_gradient_is_computed_and_the_loss_is_the_same():
    h, w, b, y = _leaves()
    with torch.no_grad():
        assert float(vocab_cross_entropy_sum(h, w, b, y, 100)) == pytest.approx(float(unfused(h, w, b, y)), rel=1e-6)


@pytest.mark.parametrize("objective", ["mlm", "crossbert"])
def test_a_model_trains_on_the_same_loss_and_gradients_with_the_chunked_head_as_with_full_logits(real_batch, objective):
    ids, attention = real_batch

    def model(chunk_rows):
        torch.manual_seed(0)
        return cm.pretraining_model_for(
            cm.config_from_preset("nano", objective=objective, vocab_size=2048, vocab_chunk_rows=chunk_rows)
        )

    if objective == "mlm":
        batch = mlm_masking(
            ids, attention, mask_ratio=0.5, mask_token_id=4, vocab_size=2048, num_special_tokens=5, rng=RowRandom(0)
        )
    else:
        batch = {
            "input_ids": ids,
            "attention_mask": attention,
            "visible": crossbert_views(attention, mask_ratio=0.5, complementary=True, rng=RowRandom(0)),
        }
    results = []
    for chunk_rows in (None, 64):  # full logits, then the chunked head (hundreds of predicted rows: several chunks)
        m = model(chunk_rows)
        out = m(**batch)
        out.loss_sum.backward()
        assert (out.logits is None) == (chunk_rows is not None)
        results.append((out.loss_sum.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (full, full_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-3)
    assert full_grads.keys() == chunked_grads.keys()
    for name in full_grads:  # the same gradients up to float rounding: relative to each gradient's size
        difference = float((chunked_grads[name] - full_grads[name]).norm() / full_grads[name].norm().clamp(min=1e-12))
        assert difference < 1e-4, (name, difference)
