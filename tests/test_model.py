"""The two models: what the CrossBERT encoder may see, what the predictor may mix, and HF round trips."""

import pytest
import torch
from transformers import AutoConfig, AutoModel

import crossbert_model as cm
from crossbert_model.checkpoint import CheckpointError, pretraining_model_from_pretrained
from crossbert_model.masking import RowRandom, crossbert_views, mlm_masking, pack_positions
from crossbert_model.objectives import num_views


def build(objective, vocab, **kw):
    torch.manual_seed(0)
    config = cm.config_from_preset("nano", objective=objective, vocab_size=vocab, **kw)
    return cm.pretraining_model_for(config).eval()


@pytest.mark.parametrize("complementary", [False, True])
def test_crossbert_encoder_never_sees_masked_tokens(real_batch, complementary):
    ids, attention = real_batch
    model = build("crossbert", 2048, complementary_masking=complementary)
    visible = crossbert_views(attention, mask_ratio=0.5, complementary=complementary, rng=RowRandom(0))
    view = visible[:, :1]  # one view: its masked tokens are visible to no other row of the batch
    masked = attention.bool() & ~view[:, 0]
    scrambled = torch.where(masked, torch.randint(5, 2048, ids.shape), ids)
    with torch.no_grad():
        a, b = model(ids, attention, view), model(scrambled, attention, view)
    assert torch.equal(a.logits, b.logits)
    # the targets do change: the loss is computed against the (scrambled) original ids
    assert not torch.equal(a.labels, b.labels)


def test_flat_mlm_does_see_its_whole_sequence(real_batch):
    ids, attention = real_batch
    model = build("mlm", 2048)
    batch = mlm_masking(ids, attention, mask_ratio=0.15, mask_token_id=4, vocab_size=2048, num_special_tokens=5, rng=RowRandom(0))
    unselected = (batch["labels"] == -100) & attention.bool()
    scrambled = dict(batch, input_ids=torch.where(unselected, torch.randint(5, 2048, ids.shape), batch["input_ids"]))
    with torch.no_grad():
        assert not torch.allclose(model(**batch).logits, model(**scrambled).logits)


def test_flat_mlm_computes_logits_only_at_selected_positions(real_batch):
    ids, attention = real_batch
    model = build("mlm", 2048)
    batch = mlm_masking(ids, attention, mask_ratio=0.15, mask_token_id=4, vocab_size=2048, num_special_tokens=5, rng=RowRandom(0))
    out = model(**batch)
    assert out.logits.shape == (int((batch["labels"] != -100).sum()), 2048)


def test_predictor_queries_do_not_interact(real_batch):
    ids, attention = real_batch
    model = build("crossbert", 2048, predictor_layers=2)
    visible = crossbert_views(attention, mask_ratio=0.5, complementary=False, rng=RowRandom(0))[:, 0]
    masked = attention.bool() & ~visible
    enc_pos, enc_valid = pack_positions(visible)
    with torch.no_grad():
        context = model.encoder(torch.gather(ids, 1, enc_pos), attention_mask=enc_valid, position_ids=enc_pos).last_hidden_state
        q_pos, q_valid = pack_positions(masked)
        full = model.predictor(context, enc_pos, enc_valid, q_pos, q_valid, model.encoder.embeddings.weight)
        # drop every other query: the remaining ones must get the same logits
        keep = torch.zeros_like(q_valid)
        keep[:, ::2] = True
        sub_pos, sub_valid = q_pos[:, ::2], q_valid[:, ::2]
        fewer = model.predictor(context, enc_pos, enc_valid, sub_pos, sub_valid, model.encoder.embeddings.weight)
    assert torch.allclose(full[keep[q_valid]], fewer, atol=1e-5)


def test_encoder_on_visible_tokens_equals_full_sequence_with_masked_keys(real_batch):
    """Gathering the visible tokens out with their ORIGINAL rotary positions is the same computation
    as attending over the full sequence with the masked tokens hidden: positions are not shifted."""
    ids, attention = real_batch
    encoder = build("crossbert", 2048).encoder
    visible = crossbert_views(attention, mask_ratio=0.5, complementary=False, rng=RowRandom(3))[:, 0]
    enc_pos, enc_valid = pack_positions(visible)
    with torch.no_grad():
        gathered = encoder(torch.gather(ids, 1, enc_pos), attention_mask=enc_valid, position_ids=enc_pos).last_hidden_state
        full = encoder(ids, attention_mask=visible.long()).last_hidden_state
    expected = torch.gather(full, 1, enc_pos.unsqueeze(-1).expand_as(gathered))
    assert torch.allclose(gathered[enc_valid], expected[enc_valid], atol=1e-5)


@pytest.mark.parametrize("objective", cm.objective_names())
def test_save_then_automodel_reload_gives_identical_outputs(real_batch, tmp_path, objective):
    ids, attention = real_batch
    model = build(objective, 2048)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    assert AutoConfig.from_pretrained(tmp_path, local_files_only=True).objective == objective
    encoder = AutoModel.from_pretrained(tmp_path, local_files_only=True).eval()
    assert type(encoder) is cm.CrossBertModel
    with torch.no_grad():
        want = model.encoder(ids, attention, output_hidden_states=True)
        got = encoder(ids, attention, output_hidden_states=True)
    assert len(got.hidden_states) == model.config.num_hidden_layers + 1  # embeddings = layer 0
    for a, b in zip(want.hidden_states, got.hidden_states):
        assert torch.equal(a, b)
    assert torch.equal(got.hidden_states[-1], got.last_hidden_state)
    # the pre-training model (head / predictor included) round-trips too
    again = pretraining_model_from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_loading_a_checkpoint_as_the_wrong_kind_is_a_clear_error(tmp_path):
    build("crossbert", 2048).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="objective='mlm'.*objective='crossbert'"):
        cm.FlatMlmForPreTraining.from_pretrained(tmp_path, local_files_only=True)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(CheckpointError, match="model_type is 'bert'"):
        pretraining_model_from_pretrained(tmp_path)


@pytest.mark.parametrize("preset", list(cm.PRESETS))
@pytest.mark.parametrize("objective", cm.objective_names())
def test_parameter_counts_are_computed_exactly(preset, objective):
    config = cm.config_from_preset(preset, objective=objective, vocab_size=8192)
    with torch.device("meta"):
        model = cm.pretraining_model_for(config)
    counts = cm.parameter_counts(config)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["encoder"] == sum(p.numel() for p in model.encoder.parameters())
    if objective == "crossbert":
        predictor = sum(p.numel() for n, p in model.predictor.named_parameters() if n != "decoder_bias")
        assert counts["predictor"] == predictor and counts["head"] == config.vocab_size


@pytest.mark.parametrize("preset", list(cm.PRESETS))
def test_the_default_predictor_is_light_at_every_preset(preset):
    config = cm.config_from_preset(preset, objective="crossbert")
    counts = cm.parameter_counts(config)
    assert config.predictor_layers == 2
    assert counts["predictor"] <= 0.25 * counts["encoder_non_embedding"]


def test_an_explicit_predictor_shape_overrides_the_default():
    config = cm.config_from_preset("tiny", objective="crossbert", predictor_layers=3, predictor_hidden_size=128)
    assert (config.predictor_layers, config.predictor_hidden_size) == (3, 128)


def test_training_flops_by_part_sum_to_the_total_and_the_mlm_has_no_predictor():
    for objective in cm.objective_names():
        config = cm.config_from_preset("mini", objective=objective)
        parts = cm.training_flops_by_part(config, 128)
        assert sum(parts.values()) == pytest.approx(cm.training_flops_per_token(config, 128))
    assert cm.training_flops_by_part(cm.config_from_preset("mini", objective="mlm"), 128)["predictor"] == 0


@pytest.mark.parametrize("ratio, views", [(0.5, 2), (2 / 3, 3), (0.667, 3), (0.75, 4), (0.8, 5)])
def test_cms_takes_ratios_with_a_whole_number_of_views(ratio, views):
    assert num_views(cm.config_from_preset("nano", objective="crossbert", mask_ratio=ratio)) == views


@pytest.mark.parametrize("ratio", [0.6, 0.3, 0.7, 0.9 - 0.01])
def test_cms_refuses_a_ratio_it_cannot_realise_exactly(ratio):
    with pytest.raises(ValueError, match="mask_ratio.*whole number"):
        cm.config_from_preset("nano", objective="crossbert", mask_ratio=ratio)
    # without CMS any ratio is one random mask of exactly that share
    assert num_views(cm.config_from_preset("nano", objective="crossbert", mask_ratio=ratio, complementary_masking=False)) == 1


def test_training_flops_follow_the_shape():
    mlm = cm.config_from_preset("base", objective="mlm")
    # a transformer's training cost is ~6 x non-embedding parameters per token, plus attention and the head
    assert 6 * cm.parameter_counts(mlm)["encoder_non_embedding"] < cm.training_flops_per_token(mlm, 128)
    # CrossBERT without CMS at r=0.5 runs the encoder on half the tokens: cheaper per token at BERT-base size
    half = cm.config_from_preset("base", objective="crossbert", complementary_masking=False, mask_ratio=0.5)
    assert cm.training_flops_per_token(half, 128) < 0.7 * cm.training_flops_per_token(mlm, 128)


# -- the shared-protocol loss (crossbert_model.shared_loss) -------------------------------------------------


def _ce_sum(logits, labels):
    return float(torch.nn.functional.cross_entropy(logits.double(), labels, reduction="sum"))


def test_shared_loss_of_flat_mlm_is_the_hand_computed_cross_entropy(real_batch):
    from crossbert_model.shared_loss import protocol_generator, protocol_selection, shared_protocol_loss

    ids, attention = real_batch
    model = build("mlm", 2048).float()
    selected = protocol_selection(attention, 0.5, protocol_generator())
    with torch.no_grad():
        loss_sum, count = shared_protocol_loss(model, ids, attention, 0.5, protocol_generator())
        # by hand: [MASK] at the selected positions, head at every position, cross-entropy at the selected ones
        hidden = model.encoder(ids.masked_fill(selected, model.config.mask_token_id), attention_mask=attention).last_hidden_state
        logits = model.head(hidden, model.encoder.embeddings.weight)
    assert count == int(selected.sum()) == sum(min(round(0.5 * n), n - 1) for n in attention.sum(dim=1).tolist())
    assert float(loss_sum) == pytest.approx(_ce_sum(logits[selected], ids[selected]), rel=1e-5)


def test_shared_loss_over_a_set_is_sum_over_count_not_a_mean_of_batch_means(real_batch):
    from crossbert_model.shared_loss import protocol_selections, shared_loss_metrics, shared_loss_sums

    ids, attention = real_batch  # the last 8 rows are padded: batches hold different target counts
    model = build("crossbert", 2048, predictor_hidden_size=64).float()  # the full-width predictor the margin was set for
    # An untrained model's losses all sit near ln V, so the two readings would differ only by float32 rounding
    # (a flaky check); sharp logits (tied embeddings x30) spread the per-token losses, and the batch means apart.
    with torch.no_grad():
        model.encoder.embeddings.weight.mul_(30.0)
    selections = protocol_selections(attention)
    with torch.no_grad():
        sums = shared_loss_sums(model, model.config, ids, selections, batch_size=31, device="cpu", attention_mask=attention)
        row_sums, row_counts = [], []
        for row in range(len(ids)):  # one sequence at a time, cross-entropy by hand
            visible = (attention[row : row + 1].bool() & ~selections[0.5][row : row + 1]).unsqueeze(1)
            out = model(ids[row : row + 1], attention[row : row + 1], visible)
            row_sums.append(_ce_sum(out.logits, out.labels))
            row_counts.append(len(out.labels))
    total, count = sums[0.5]
    expected_counts = [min(round(0.5 * n), n - 1) for n in attention.sum(dim=1).tolist()]
    assert row_counts == expected_counts and count == sum(expected_counts)
    assert total == pytest.approx(sum(row_sums), rel=1e-5)
    metrics = shared_loss_metrics(sums)
    assert metrics["shared_loss_r50"] == pytest.approx(sum(row_sums) / count, rel=1e-5)
    # the test can tell the two apart: with batches of 31 rows and 1 (a padded row), the mean of the two batch
    # means is another number, far outside the tolerance above
    batch_means = [sum(row_sums[a:b]) / sum(row_counts[a:b]) for a, b in ((0, 31), (31, 32))]
    assert abs(sum(batch_means) / 2 - metrics["shared_loss_r50"]) > 100 * 1e-5 * metrics["shared_loss_r50"]
    assert metrics["shared_targets_r15"] == sum(min(round(0.15 * n), n - 1) for n in attention.sum(dim=1).tolist())


@pytest.mark.parametrize("objective", cm.objective_names())
def test_an_untrained_models_shared_loss_is_near_ln_vocab(real_batch, objective):
    import math

    from crossbert_model.shared_loss import protocol_generator, shared_protocol_loss

    ids, attention = real_batch
    model = build(objective, 2048).float()
    for ratio in (0.15, 0.5):
        with torch.no_grad():
            loss_sum, count = shared_protocol_loss(model, ids, attention, ratio, protocol_generator())
        assert float(loss_sum) / count == pytest.approx(math.log(2048), abs=0.1)


# -- activation checkpointing and compilation per block ---------------------------------------


@pytest.mark.parametrize("objective", cm.objective_names())
def test_activation_checkpointing_gives_the_same_loss_and_gradients(real_batch, objective):
    """Blocks that recompute their activations in the backward (torch.utils.checkpoint, non-reentrant)
    give the loss and every gradient of blocks that keep them, bit for bit on the CPU, and do recompute:
    each block runs twice per step (a checkpointing that silently did nothing fails here)."""
    from crossbert_model.objectives import pretraining_batch
    from crossbert_model.model import Block, PredictorBlock

    ids, attention = real_batch
    model = build(objective, 2048, predictor_layers=2).train()
    batch = pretraining_batch(ids, attention, model.config, RowRandom(0))
    blocks = [m for m in model.modules() if isinstance(m, (Block, PredictorBlock))]
    runs = []  # one entry per block forward, recomputations included
    for block in blocks:
        block.attn_norm.register_forward_hook(lambda *_: runs.append(1))
    results = {}
    for enabled in (False, True):
        model.set_activation_checkpointing(enabled)
        model.zero_grad(set_to_none=True)
        runs.clear()
        out = model(**batch)
        out.loss.backward()
        results[enabled] = (out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, len(runs))
    (loss_off, grads_off, runs_off), (loss_on, grads_on, runs_on) = results[False], results[True]
    assert (runs_off, runs_on) == (len(blocks), 2 * len(blocks))
    torch.testing.assert_close(loss_on, loss_off, rtol=0, atol=0)
    assert grads_on.keys() == grads_off.keys()
    for name in grads_off:
        torch.testing.assert_close(grads_on[name], grads_off[name], rtol=0, atol=0, msg=name)
    with torch.no_grad():  # evaluation keeps nothing for a backward: no recomputation to arrange
        runs.clear()
        model(**batch)
        assert len(runs) == len(blocks)


def test_compile_blocks_compiles_each_block_and_leaves_the_state_dict_alone():
    """Under FSDP the trainer compiles per block (FSDP's gathers and reductions stay in eager hooks around
    the compiled computation): every Block / PredictorBlock computation is compiled, the root is not, and
    the parameter names a checkpoint is saved under do not change."""
    from crossbert_model.distributed import compile_blocks
    from crossbert_model.model import Block, PredictorBlock

    model = build("crossbert", 2048)
    keys = list(model.state_dict())
    compile_blocks(model, (Block, PredictorBlock))
    blocks = [m for m in model.modules() if isinstance(m, (Block, PredictorBlock))]
    assert blocks and all(hasattr(b.compute, "_torchdynamo_orig_callable") for b in blocks)
    assert not hasattr(model.forward, "_torchdynamo_orig_callable")
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("objective", cm.objective_names())
def test_embedding_init_std_draws_only_the_embeddings_larger(objective, tmp_path):
    plain, wide = build(objective, 2048), build(objective, 2048, embedding_init_std=1.0)
    for (name, a), (_, b) in zip(plain.state_dict().items(), wide.state_dict().items()):
        if name == "encoder.embeddings.weight":  # the same draw, 50 times the default std
            assert torch.allclose(b, 50.0 * a, rtol=1e-5, atol=1e-6) and 0.95 < float(b.std()) < 1.05
        else:
            assert torch.equal(a, b), name
    wide.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path, local_files_only=True).embedding_init_std == 1.0


def test_flat_mlm_starts_near_the_uniform_loss_with_crossberts_embedding_draw(real_batch):
    """The scaled tied head: without it the std-1.0 draw starts flat MLM at a loss of 37-45 (diverged at step 0)."""
    ids, attention = real_batch
    batch = mlm_masking(ids, attention, mask_ratio=0.15, mask_token_id=4, vocab_size=2048, num_special_tokens=5, rng=RowRandom(0))
    uniform = torch.log(torch.tensor(2048.0))
    with torch.no_grad():
        for std in (None, 1.0):
            loss = build("mlm", 2048, embedding_init_std=std)(**batch).loss
            assert abs(float(loss) - float(uniform)) < 0.5, (std, float(loss))
    assert build("mlm", 2048).head.logit_scale == 1.0  # the default draw's head is unchanged


@pytest.mark.parametrize("objective", ["mlm", "crossbert"])
def test_the_encoder_of_a_pretraining_checkpoint_loads_without_an_unexpected_keys_report(tmp_path, objective, capsys, caplog):
    import logging

    from transformers.utils import logging as hf_logging

    build(objective, 512).save_pretrained(tmp_path)
    hf_logging.set_verbosity_warning()
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            encoder = AutoModel.from_pretrained(tmp_path)
    finally:
        hf_logging.disable_propagation()
    assert type(encoder).__name__ == "CrossBertModel"
    said = caplog.text + capsys.readouterr().err
    assert "UNEXPECTED" not in said and "MISSING" not in said, said
