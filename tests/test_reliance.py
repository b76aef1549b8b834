"""Encoder reliance (crossbert_model.reliance) and the predictor's position routes: what makes an encoder order-blind,
what the encoder rule answers, and that the "encoder" route leaves the predictor no positions of its own."""

import math
import re

import pytest
import torch

import crossbert_model as cm
from crossbert_model.config import check_model_values
from crossbert_model.masking import RowRandom, crossbert_views, pack_positions
from crossbert_model.plateau import PLATEAU_MARGIN
from crossbert_model.reliance import (
    ENCODER_RELIANCE_SHARE,
    adjacent_swaps,
    carries_context,
    encoder_ablation,
    encoder_reliance,
    identity_share,
    order_blind_share,
)


def build(objective="crossbert", **config):
    torch.manual_seed(0)
    return cm.pretraining_model_for(cm.config_from_preset("nano", objective=objective, vocab_size=512, **config)).eval()


ROUTES = [{}, {"absolute_positions": True}, {"absolute_positions": True, "predictor_positions": "encoder"}]


def _states(encoder, ids):
    with torch.no_grad():
        return encoder(ids).last_hidden_state


@pytest.mark.parametrize("route", ROUTES, ids=["rotary", "rotary+absolute", "encoder"])
def test_an_order_blind_encoder_gives_each_token_the_same_state_wherever_the_tokens_stand(route):
    encoder = build(**route).encoder
    ids = torch.randint(5, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    order = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    as_trained = _states(encoder, ids)
    assert not torch.allclose(_states(encoder, ids[:, order]), as_trained[:, order], atol=1e-5)  # order matters...
    with encoder_ablation(encoder, "order_blind"):
        blind, permuted = _states(encoder, ids), _states(encoder, ids[:, order])
    torch.testing.assert_close(permuted, blind[:, order], atol=1e-5, rtol=1e-5)  # ...until the encoder is made order-blind
    assert torch.equal(_states(encoder, ids), as_trained)  # and the encoder is put back as it was


def test_absolute_positions_make_the_encoder_say_where_a_token_is():
    ids = torch.randint(5, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    relative = build().encoder  # rotary only: shifting every position changes nothing
    shifted = torch.arange(24).expand(2, -1) + 7
    with torch.no_grad():
        torch.testing.assert_close(
            relative(ids, position_ids=shifted).last_hidden_state, _states(relative, ids), atol=1e-5, rtol=1e-5
        )
        absolute = build(absolute_positions=True).encoder
        assert not torch.allclose(absolute(ids, position_ids=shifted).last_hidden_state, _states(absolute, ids), atol=1e-3)


def test_a_bypassed_encoder_is_its_embeddings_through_the_final_norm():
    encoder = build(absolute_positions=True).encoder
    ids = torch.randint(5, 512, (2, 16))
    with encoder_ablation(encoder, "bypassed"), torch.no_grad():
        expected = encoder.norm(encoder.embeddings(ids) + encoder.position_embeddings(torch.arange(16)))
        torch.testing.assert_close(_states(encoder, ids), expected)
    assert len(encoder.layers) == 2


def test_an_unknown_ablation_is_refused():
    with pytest.raises(ValueError, match="expected one of"):
        with encoder_ablation(build().encoder, "shuffled"):
            pass


def _predict(model, ids, attention, context_positions_shift=0):
    """The predictor's logits for one view, with the encoder's outputs held fixed and only the positions the
    predictor is told for them shifted."""
    visible = crossbert_views(attention, mask_ratio=0.5, complementary=False, rng=RowRandom(0))[:, 0]
    enc_pos, enc_valid = pack_positions(visible)
    query_pos, query_valid = pack_positions(attention.bool() & ~visible)
    with torch.no_grad():
        context = model.encoder(
            torch.gather(ids, 1, enc_pos), attention_mask=None if enc_valid is None else enc_valid.long(), position_ids=enc_pos
        ).last_hidden_state
        return model.predictor(
            context, enc_pos + context_positions_shift, enc_valid, query_pos, query_valid, model.encoder.embeddings.weight
        )


def test_on_the_encoder_route_the_predictors_keys_carry_no_position_of_their_own():
    ids = torch.randint(5, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    encoder_route, rotary_route = build(absolute_positions=True, predictor_positions="encoder"), build()
    for model in (encoder_route, rotary_route):  # at initialisation the queries attend almost uniformly: sharpen them
        torch.nn.init.normal_(model.predictor.mask_embedding)
        for linear in (m for m in model.predictor.modules() if isinstance(m, torch.nn.Linear)):
            torch.nn.init.normal_(linear.weight, std=0.5)
    assert torch.equal(_predict(encoder_route, ids, attention, 5), _predict(encoder_route, ids, attention))
    moved = (_predict(rotary_route, ids, attention, 5) - _predict(rotary_route, ids, attention)).abs().max()
    assert moved > 0.01  # on the rotary route the keys' own positions steer the queries


def test_the_encoder_route_without_absolute_positions_is_refused_in_one_line_naming_the_field():
    with pytest.raises(
        ValueError, match=r"^config field 'model\.absolute_positions': expected true when model\.predictor_positions is 'encoder'"
    ):
        check_model_values(0.5, 0.8, 0.1, "gelu", "layernorm", section="model.", predictor_positions="encoder")
    with pytest.raises(ValueError, match=r"config field 'predictor_positions': expected one of rotary, encoder, got 'queries'"):
        check_model_values(0.5, 0.8, 0.1, "gelu", "layernorm", predictor_positions="queries")


def test_the_encoder_rule_passes_from_a_quarter_of_the_margin_lost_and_answers_only_off_the_plateau():
    # unigram entropy 7.0, loss 5.0: a margin of 2 nats; the order-blind encoder loses 0.5 of them = exactly a quarter
    assert ENCODER_RELIANCE_SHARE == 0.25
    assert order_blind_share(5.0, 5.5, 7.0) == pytest.approx(0.25)
    assert carries_context(5.0, 5.5, 7.0) is True
    assert carries_context(5.0, 5.49, 7.0) is False
    assert carries_context(7.2, 7.3, 7.0) is None  # above the entropy: nothing to lose, no answer
    # on the plateau (a margin under PLATEAU_MARGIN): a share of noise, no answer either way
    assert carries_context(6.7, 7.5, 7.0) is None and carries_context(6.97, 6.971, 7.0) is None
    assert carries_context(7.0 - PLATEAU_MARGIN, 7.0, 7.0) is True  # from the plateau's margin on, the rule answers
    assert carries_context(5.0, math.nan, 7.0) is None and carries_context(5.0, None, 7.0) is None


def test_token_identity_explains_all_of_a_per_token_code_and_nothing_of_noise():
    ids = torch.randint(0, 20, (4000,), generator=torch.Generator().manual_seed(0))
    code = torch.randn(20, 8, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(4000, 8, generator=torch.Generator().manual_seed(2))
    assert identity_share(code[ids], ids) == pytest.approx(1.0)
    assert abs(identity_share(noise, ids)) < 0.01  # adjusted: chance alone gives about 0, not k / n
    assert identity_share(code[ids] + noise, ids) == pytest.approx(float(code.var(0).sum() / (code.var(0).sum() + 8)), abs=0.05)


def test_an_adjacent_swap_exchanges_two_different_neighbours_inside_the_sequence():
    ids = torch.randint(5, 50, (64, 16), generator=torch.Generator().manual_seed(0))
    ids[0] = 7  # nothing to swap in a row of one token
    swapped, first = adjacent_swaps(ids, torch.Generator().manual_seed(0))
    assert first[0] == -1 and torch.equal(swapped[0], ids[0])
    for row in range(1, 64):
        i = int(first[row])
        assert 1 <= i and i + 1 <= 14  # never the first or the last position
        assert ids[row, i] != ids[row, i + 1]
        assert swapped[row, i] == ids[row, i + 1] and swapped[row, i + 1] == ids[row, i]
        assert (swapped[row] != ids[row]).sum() == 2


@pytest.mark.parametrize("objective", ["mlm", "crossbert"])
def test_every_reliance_metric_is_measured_for_both_objectives_on_real_sequences(corpus, objective):
    torch.manual_seed(0)
    model = cm.pretraining_model_for(cm.config_from_preset("nano", objective=objective, vocab_size=len(corpus.tokenizer))).eval()
    ids = corpus.val.get(list(range(16)))
    out = encoder_reliance(model, ids, unigram_entropy=9.0, batch_size=8)
    layers = model.config.num_hidden_layers
    for key in (
        "reliance_loss",
        "reliance_loss_order_blind",
        "reliance_loss_bypassed",
        "reliance_share",
        *(f"{m}_l{i}" for m in ("identity_share", "swap_pooled", "swap_neighbour") for i in range(layers + 1)),
    ):
        assert math.isfinite(out[key]), key
    assert out["swap_pooled_l0"] == pytest.approx(0.0, abs=1e-6)  # the embedding layer: a swap only reorders, the mean stays
    assert out["encoder_carries_context"] is carries_context(out["reliance_loss"], out["reliance_loss_order_blind"], 9.0)


def test_crossbert_reliance_measures_a_training_checkpoint_on_its_own_runs_sequences(tmp_path, corpus_args, corpus, capsys):
    from tiny_configs import tiny_train_config

    from crossbert_eval.cli import main
    from crossbert_model.checkpoint import list_checkpoints
    from crossbert_model.train import train

    cfg = tiny_train_config(corpus_args, tmp_path, "crossbert")
    cfg.model.absolute_positions, cfg.model.predictor_positions = True, "encoder"
    train(cfg)
    (step, checkpoint), *_ = reversed(list_checkpoints(tmp_path / "crossbert"))
    main(["reliance", str(checkpoint), "--eval-sequences", "8"])
    out = capsys.readouterr().out
    assert re.search(r"^reliance_sequences +8$", out, re.M) and re.search(r"^identity_share_l2 +\d\.\d{4}$", out, re.M)
    assert "the encoder rule (order-blind encoder loses >= 0.25 of the margin): " in out
