"""The probing family's premise: our encoders' layer 0 (token embeddings; rotary positions act only inside
attention) mean-pooled cannot see word order, so bigram shift sits at chance there by construction, while
a contextual layer can tell a sentence from its shifted twin."""

import numpy as np
import pytest

from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.tasks import get_task

# At the default init (std 0.02) attention is near uniform, so an untrained encoder's contextual layers are
# themselves almost blind to order (a shift moved layer 1 by 3e-6 here); a wider init gives sharp attention, where
# the rotary positions matter, as they do after training. Layer 0 is blind whatever the weights.
SHARP_INIT = 0.5


@pytest.fixture(scope="module")
def shifted_pair(real_data_root):
    """An original BigramShift test sentence and its twin with two adjacent (different) words swapped."""
    task = get_task("BigramShift")
    split = task.load_split("test", real_data_root)
    original = split.labels == task.label_mapping(real_data_root)["O"]
    sentence = next(t for t, o in zip(split.texts, original) if o and len(t.split()) >= 8)
    words = sentence.split()
    i = next(i for i in range(len(words) // 2, len(words) - 1) if words[i] != words[i + 1])
    words[i], words[i + 1] = words[i + 1], words[i]
    return sentence, " ".join(words)


def _gaps(encoder, pair) -> list[float]:
    """Per layer, the largest difference between the mean-pooled features of the two texts (the probes' features)."""
    features = encoder.encode(list(pair), layers=encoder.layer_indices(LayerSpec.ALL), poolings=["mean"])
    pairs = [features[(layer, "mean")] for layer in range(encoder.num_layers + 1)]
    return [float(np.abs(first - second).max()) for first, second in pairs]


def test_our_layer_zero_is_blind_to_a_bigram_shift_and_contextual_layers_are_not(nano_checkpoint, shifted_pair):
    encoder = FrozenEncoder.load(str(nano_checkpoint(0, initializer_range=SHARP_INIT)), dtype="fp32")
    a, b = (encoder.tokenize([text])["input_ids"][0] for text in shifted_pair)
    assert a != b and sorted(a) == sorted(b)  # the same tokens in another order
    gaps = _gaps(encoder, shifted_pair)
    assert gaps[0] < 1e-6, f"layer 0 sees the shift (max difference {gaps[0]:.1e}): identical features expected"
    assert all(gap > 1e-3 for gap in gaps[1:]), f"a contextual layer does not see the shift: {gaps}"


def test_minilm_layer_zero_sees_word_order_through_its_position_embeddings(shifted_pair):
    """BERT-style models add position embeddings before a LayerNorm: their layer 0 is near, not at, chance."""
    gaps = _gaps(FrozenEncoder.load("minilm", dtype="fp32"), shifted_pair)
    assert 1e-5 < gaps[0] < min(gaps[1:])
