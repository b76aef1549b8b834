"""The unigram plateau (crossbert_model.plateau): the loss of a model that knows token frequencies only."""

import math

import numpy as np
import pytest

from crossbert_model.data.sequences import PackedSequences, unigram_counts
from crossbert_model.plateau import PLATEAU_MARGIN, off_plateau, plateau_margin, unigram_cross_entropy
from crossbert_model.shared_loss import SHARED_LOSS_KEYS, protocol_key, protocol_ratios

CLS, SEP, MASK, V = 2, 3, 4, 8  # a vocabulary of 8 ids, 0..4 special as in trained tokenizers


def hand_made_training_split() -> PackedSequences:
    """The stream 5 6 5 7 5 6 [SEP] packed in sequences of 4: [CLS] 5 6 [SEP] | [CLS] 5 7 [SEP] | [CLS] 5 6 [SEP];
    the last stream token fills no complete window, so no sequence holds it."""
    return PackedSequences(np.array([5, 6, 5, 7, 5, 6, SEP], dtype=np.uint16), seq_len=4, cls_id=CLS, sep_id=SEP)


def test_unigram_counts_are_those_of_the_training_sequences_as_the_model_reads_them():
    counts = unigram_counts(hand_made_training_split(), V)
    assert counts.tolist() == [0, 0, 3, 3, 0, 3, 2, 1]  # [CLS] x3, [SEP] x3, 5 x3, 6 x2, 7 x1
    assert counts.tolist() == unigram_counts(hand_made_training_split(), V, chunk=1).tolist()  # chunking changes nothing


def test_unigram_cross_entropy_is_the_add_one_smoothed_hand_computed_value():
    counts = unigram_counts(hand_made_training_split(), V)  # N = 12 tokens, V = 8: p(t) = (count + 1) / 20
    targets = [5, 7, MASK, CLS]  # p = 4/20, 2/20, 1/20 (never seen: finite), 4/20
    expected = (math.log(20 / 4) + math.log(20 / 2) + math.log(20 / 1) + math.log(20 / 4)) / 4
    assert unigram_cross_entropy(counts, targets) == pytest.approx(expected, rel=1e-12)
    assert unigram_cross_entropy(counts, np.array([[5, 7], [MASK, CLS]])) == pytest.approx(expected, rel=1e-12)  # any shape
    assert math.isnan(unigram_cross_entropy(counts, []))  # no target, no entropy


def test_a_run_is_off_the_plateau_from_exactly_half_a_nat_below_the_unigram_entropy():
    assert PLATEAU_MARGIN == 0.5
    assert off_plateau(6.5, 7.0) is True  # exactly the margin: off
    assert off_plateau(6.25, 7.0) is True
    assert off_plateau(6.5 + 2**-20, 7.0) is False  # a hair less than the margin: on
    assert off_plateau(7.25, 7.0) is False  # above the entropy
    assert plateau_margin(6.25, 7.0) == 0.75
    for unknown in (None, math.nan):
        assert off_plateau(unknown, 7.0) is None and off_plateau(6.0, unknown) is None


def test_protocol_metric_names_come_from_the_ratio_and_a_runs_own_ratio_is_always_scored():
    assert SHARED_LOSS_KEYS == {0.15: "shared_loss_r15", 0.5: "shared_loss_r50"}  # the names runs have recorded
    assert protocol_key("unigram_entropy", 0.3) == "unigram_entropy_r30"
    assert protocol_key("shared_loss", 2 / 3) == "shared_loss_r66p67"
    assert protocol_ratios(0.15) == protocol_ratios(0.5) == protocol_ratios() == (0.15, 0.5)
    assert protocol_ratios(0.3) == (0.15, 0.3, 0.5)
