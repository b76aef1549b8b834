"""Masking statistics and invariants, on real Wikipedia token sequences."""

import pytest
import torch

from crossbert_model.config import cms_num_views
from crossbert_model.masking import RowRandom, complementary_views, mlm_masking, num_targets, pack_positions, random_views


@pytest.mark.parametrize("ratio", [0.5, 2 / 3, 0.75])
def test_every_cms_view_set_partitions_the_real_tokens(real_batch, ratio):
    ids, attention = real_batch
    k = cms_num_views(ratio)
    visible = complementary_views(attention, k, RowRandom(0))
    assert visible.shape == (ids.shape[0], k, ids.shape[1])
    times_visible = visible.sum(dim=1)
    # each real token visible in exactly one view (so masked in the K-1 others); padding in none
    assert torch.equal(times_visible, attention.long())
    # groups of equal size (differing by at most one token when n is not divisible by K)
    sizes = visible.sum(dim=2)
    assert int((sizes.max(dim=1).values - sizes.min(dim=1).values).max()) <= 1
    # masked set of view k = real tokens minus group k
    masked = attention.bool().unsqueeze(1) & ~visible
    assert torch.equal(masked.sum(dim=1), (k - 1) * attention.long())


def test_cms_with_half_masking_gives_exact_complements(real_batch):
    ids, attention = real_batch
    visible = complementary_views(attention, 2, RowRandom(1))
    real = attention.bool()
    assert torch.equal(visible[:, 0] & real, real & ~visible[:, 1])


def test_cms_partition_is_random_not_fixed(real_batch):
    ids, attention = real_batch
    a = complementary_views(attention, 2, RowRandom(0))
    b = complementary_views(attention, 2, RowRandom(1))
    assert not torch.equal(a, b)
    # and a view is not a contiguous block: on a 64-token row, group 0 interleaves with group 1
    row = a[0, 0].nonzero().flatten()
    assert (row.diff() > 1).any()


def test_random_views_keep_the_requested_fraction_visible(real_batch):
    ids, attention = real_batch
    visible = random_views(attention, 0.75, RowRandom(0))
    assert visible.shape == (ids.shape[0], 1, ids.shape[1])
    n = attention.sum(dim=1)
    expected = torch.clamp(torch.round(n * 0.25), min=1)
    assert torch.equal(visible[:, 0].sum(dim=1), expected.long())
    assert not (visible[:, 0] & ~attention.bool()).any()


def test_mlm_masking_follows_80_10_10_on_real_tokens(corpus):
    ids = corpus.train.get(list(range(min(len(corpus.train), 600))))
    attention = torch.ones_like(ids)
    vocab = len(corpus.tokenizer)
    out = mlm_masking(
        ids,
        attention,
        mask_ratio=0.15,
        mask_token_id=corpus.tokenizer.mask_token_id,
        vocab_size=vocab,
        num_special_tokens=5,
        rng=RowRandom(0),
    )
    selected = out["labels"] != -100
    # exactly round(0.15 * n) per sequence
    assert torch.equal(selected.sum(dim=1), torch.full((ids.shape[0],), round(0.15 * ids.shape[1])))
    # labels are the original tokens
    assert torch.equal(out["labels"][selected], ids[selected])
    n = int(selected.sum())
    became_mask = (out["input_ids"] == corpus.tokenizer.mask_token_id) & selected
    unchanged = (out["input_ids"] == ids) & selected
    changed_to_other = selected & ~became_mask & ~unchanged
    # binomial standard error at n ~ 5,700 is ~0.5% for 80% and ~0.4% for 10%
    assert abs(became_mask.sum() / n - 0.8) < 0.02
    # "kept" also catches random draws that hit the original token (p ~ 1/vocab)
    assert abs(unchanged.sum() / n - 0.1) < 0.015
    assert abs(changed_to_other.sum() / n - 0.1) < 0.015
    # unselected tokens are never touched; random replacements are never special tokens
    assert torch.equal(out["input_ids"][~selected], ids[~selected])
    assert (out["input_ids"][changed_to_other] >= 5).all()


def test_mlm_masking_never_selects_padding(real_batch):
    ids, attention = real_batch
    out = mlm_masking(ids, attention, mask_ratio=0.3, mask_token_id=4, vocab_size=2048, num_special_tokens=5, rng=RowRandom(0))
    selected = out["labels"] != -100
    assert not (selected & ~attention.bool()).any()
    assert torch.equal(selected.sum(dim=1), torch.clamp(torch.round(attention.sum(1) * 0.3), min=1).long())


def test_pack_positions_left_packs_in_order():
    select = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    positions, valid = pack_positions(select)
    assert positions.tolist() == [[1, 3, 4], [0, 0, 0]]
    assert valid.tolist() == [[True, True, True], [True, False, False]]


def test_num_targets_counts_every_masked_real_token_of_every_view(real_batch):
    ids, attention = real_batch
    visible = complementary_views(attention, 2, RowRandom(0))
    batch = {"input_ids": ids, "attention_mask": attention, "visible": visible}
    assert num_targets(batch) == int(attention.sum())  # K = 2: each token predicted once


# -- the shared protocol (crossbert_model.shared_loss) ------------------------------------------------------


def _spy(config):
    """A stand-in model that records the inputs the shared protocol gives it."""
    from types import SimpleNamespace

    seen = {}

    def model(**batch):
        seen.update(batch)
        if "labels" in batch:
            count = batch["labels"].ne(-100).sum()
        else:
            count = (batch["attention_mask"].bool() & ~batch["visible"][:, 0]).sum()
        return SimpleNamespace(loss_sum=torch.tensor(0.0), num_predicted=count)

    return model, seen


def _objective_configs():
    from crossbert_model.objectives import config_from_preset, objective_names

    return {o: config_from_preset("nano", objective=o, vocab_size=2048) for o in objective_names()}


@pytest.mark.parametrize("ratio", [0.15, 0.5])
def test_shared_protocol_selects_round_r_n_real_tokens_per_row(real_batch, ratio):
    from crossbert_model.shared_loss import protocol_generator, protocol_selection

    ids, attention = real_batch
    selected = protocol_selection(attention, ratio, protocol_generator())
    assert not (selected & ~attention.bool()).any()  # never padding
    n = attention.sum(dim=1).tolist()
    assert selected.sum(dim=1).tolist() == [min(round(ratio * k), k - 1) for k in n]


def test_shared_protocol_selection_depends_on_the_protocol_seed_only(real_batch):
    from crossbert_model.shared_loss import protocol_generator, protocol_selection

    ids, attention = real_batch
    torch.manual_seed(0)
    a = protocol_selection(attention, 0.5, protocol_generator())
    torch.manual_seed(1)  # the global RNG (model init, run seed) plays no part
    assert torch.equal(a, protocol_selection(attention, 0.5, protocol_generator()))
    assert not torch.equal(a, protocol_selection(attention, 0.5, torch.Generator().manual_seed(99)))
    # one generator seed for every ratio: the 15% selection nests inside the 50% one
    small = protocol_selection(attention, 0.15, protocol_generator())
    assert torch.equal(small & a, small)


@pytest.mark.parametrize("ratio", [0.15, 0.5])
def test_both_objectives_are_asked_the_same_positions_under_the_shared_protocol(real_batch, ratio):
    from crossbert_model.shared_loss import protocol_generator, protocol_selection, shared_protocol_loss

    ids, attention = real_batch
    configs = _objective_configs()
    (mlm, mlm_seen), (cb, cb_seen) = _spy(configs["mlm"]), _spy(configs["crossbert"])
    _, mlm_count = shared_protocol_loss(mlm, ids, attention, ratio, protocol_generator(), config=configs["mlm"])
    _, cb_count = shared_protocol_loss(cb, ids, attention, ratio, protocol_generator(), config=configs["crossbert"])
    selected = protocol_selection(attention, ratio, protocol_generator())
    real = attention.bool()

    # flat MLM: [MASK] at every selected position, every other id untouched, labels at the selected ones
    assert torch.equal(mlm_seen["labels"] != -100, selected)
    assert torch.equal(mlm_seen["labels"][selected], ids[selected])
    assert bool((mlm_seen["input_ids"][selected] == configs["mlm"].mask_token_id).all())
    assert torch.equal(mlm_seen["input_ids"][~selected], ids[~selected])
    # CrossBERT: one view whose visible tokens are exactly the real unselected ones; ids uncorrupted
    assert cb_seen["visible"].shape == (ids.shape[0], 1, ids.shape[1])
    assert torch.equal(cb_seen["visible"][:, 0], real & ~selected)
    assert torch.equal(cb_seen["input_ids"], ids)
    # hence the same targets for both
    assert torch.equal(real & ~cb_seen["visible"][:, 0], mlm_seen["labels"] != -100)
    assert mlm_count == cb_count == int(selected.sum())


def test_shared_protocol_refuses_a_ratio_outside_0_1(real_batch):
    from crossbert_model.shared_loss import SharedLossError, protocol_generator, protocol_selection

    with pytest.raises(SharedLossError, match="'ratio': expected a number in \\(0, 1\\), got 1.0"):
        protocol_selection(real_batch[1], 1.0, protocol_generator())


def test_pure_masking_replaces_every_selected_token_by_mask(real_batch):
    ids, attention = real_batch
    batch = mlm_masking(
        ids,
        attention,
        mask_ratio=0.5,
        mask_token_id=4,
        vocab_size=2048,
        num_special_tokens=5,
        rng=RowRandom(0),
        mask_prob=1.0,
        random_prob=0.0,
    )
    selected = batch["labels"] != -100
    assert bool((batch["input_ids"][selected] == 4).all())
    assert torch.equal(batch["input_ids"][~selected], ids[~selected])


@pytest.mark.parametrize(
    "objective, ratio, cms",
    [("mlm", 0.15, True), ("crossbert", 0.5, True), ("crossbert", 2 / 3, True), ("crossbert", 0.5, False)],
)
def test_target_ids_are_the_original_tokens_each_objective_is_asked_to_predict(real_batch, objective, ratio, cms):
    from crossbert_model.objectives import config_from_preset
    from crossbert_model.masking import target_ids
    from crossbert_model.objectives import pretraining_batch

    ids, attention = real_batch
    config = config_from_preset("nano", objective=objective, vocab_size=2048, mask_ratio=ratio, complementary_masking=cms)
    batch = pretraining_batch(ids, attention, config, RowRandom(0))
    targets = target_ids(batch)
    assert len(targets) == num_targets(batch)
    if objective == "mlm":  # the selected tokens, before corruption
        expected = ids[batch["labels"] != -100]
    else:  # every real token once per view it is masked in (CMS: K - 1 views)
        masked = attention.bool().unsqueeze(1) & ~batch["visible"]
        expected = ids.unsqueeze(1).expand_as(masked)[masked]
    assert torch.equal(torch.bincount(targets, minlength=2048), torch.bincount(expected, minlength=2048))


# -- per-row randomness: each process draws its own rows ----------------------------------------

SPECS = {
    "mlm15": dict(objective="mlm", mask_ratio=0.15),
    "mlm30": dict(objective="mlm", mask_ratio=0.3),
    "crossbert_cms_r50": dict(objective="crossbert", mask_ratio=0.5),
    "crossbert_cms_r75": dict(objective="crossbert", mask_ratio=0.75),
    "crossbert_nocms_r50": dict(objective="crossbert", mask_ratio=0.5, complementary_masking=False),
}


def _config(name):
    from crossbert_model.objectives import config_from_preset

    return config_from_preset("nano", vocab_size=2048, **SPECS[name])


@pytest.mark.parametrize("name", list(SPECS))
def test_a_process_drawing_only_its_rows_gets_exactly_those_rows_of_the_global_batch(corpus, name):
    """Rows 8-15 drawn alone (as rank 1 of 2 does) are rows 8-15 of the 16-row global batch, bit for bit,
    packing included: so N processes train on the masks one process draws."""
    from crossbert_model.objectives import pretraining_batch

    config, ids = _config(name), corpus.train.get(list(range(16)))
    step = RowRandom(seed=3, step=7)
    whole = pretraining_batch(ids, torch.ones_like(ids), config, step)
    parts = [pretraining_batch(ids[lo : lo + 8], torch.ones_like(ids[lo : lo + 8]), config, step.from_row(lo)) for lo in (0, 8)]
    assert whole.keys() == parts[0].keys()
    for key, value in whole.items():
        if value is None:
            assert parts[0][key] is None and parts[1][key] is None, key
        else:
            assert torch.equal(value, torch.cat([p[key] for p in parts])), key
    # and the draw is the step's: another step, another seed or another row numbering masks differently
    masks = "labels" if config.objective == "mlm" else "visible"
    for other in (RowRandom(seed=3, step=8), RowRandom(seed=4, step=7), step.from_row(1)):
        assert not torch.equal(pretraining_batch(ids, torch.ones_like(ids), config, other)[masks], whole[masks])


@pytest.mark.parametrize("name", list(SPECS))
def test_targets_per_row_is_the_count_every_draw_predicts(real_batch, name):
    """The loss normaliser of the global batch is known from the rows' lengths alone, including rows
    shorter than K (a view without a visible token predicts nothing), so no process needs the others' masks."""
    from crossbert_model.objectives import pretraining_batch, targets_per_row

    config = _config(name)
    ids, attention = real_batch
    attention = attention.clone()
    attention[[0, 1, 2], :] = 0
    for row, length in ((0, 1), (1, 2), (2, 3)):
        attention[row, :length] = 1
    expected = targets_per_row(attention.sum(dim=1), config)
    for seed in range(3):
        batch = pretraining_batch(ids, attention, config, RowRandom(seed))
        if config.objective == "mlm":
            per_row = (batch["labels"] != -100).sum(dim=1)
        else:
            valid = batch["query_valid"]
            per_row = valid.sum(dim=(1, 2)) if valid is not None else torch.full((len(ids),), batch["query_positions"][0].numel())
        assert torch.equal(per_row, expected)
        assert num_targets(batch) == int(expected.sum())


@pytest.mark.parametrize("name", ["mlm15", "crossbert_cms_r75", "crossbert_nocms_r50"])
def test_every_position_is_masked_equally_often(name):
    """The counter-based draws are uniform over positions: over 4,096 rows of 64 tokens each position is a
    target (MLM) / visible in view 0 (CrossBERT) at the expected rate, within 5 binomial standard errors."""
    from crossbert_model.objectives import pretraining_batch

    config = _config(name)
    ids = torch.randint(5, 2048, (4096, 64), generator=torch.Generator().manual_seed(0))
    batch = pretraining_batch(ids, torch.ones_like(ids), config, RowRandom(0, 11))
    chosen = (batch["labels"] != -100) if config.objective == "mlm" else batch["visible"][:, 0]
    rate = chosen.float().mean(dim=0)
    p = float(rate.mean())
    assert p == pytest.approx(
        round(64 * SPECS[name]["mask_ratio"]) / 64 if config.objective == "mlm" else 1 - SPECS[name]["mask_ratio"]
    )
    assert float((rate - p).abs().max()) < 5 * (p * (1 - p) / 4096) ** 0.5
