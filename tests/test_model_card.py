"""The model card's licence and wording: the weights' `license` is the training text's terms (the data root's
MANIFEST.md), never the code's; the body names each objective as people do. No training: cards of fresh configs."""

import pytest
import yaml

from crossbert_model.model_card import CODE_LICENSE, CORPUS_LICENSE_IDS, model_card, weights_license
from crossbert_model.objectives import config_from_preset, objective_names


def header_and_body(text: str) -> tuple[dict, str]:
    header, body = text.removeprefix("---\n").split("\n---\n", 1)
    return yaml.safe_load(header), body


@pytest.mark.parametrize(
    ("manifest_licence", "fields"),
    [
        ("Wikipedia text: CC BY-SA 3.0 / GFDL", {"license": "cc-by-sa-3.0"}),  # the main corpus's MANIFEST row
        ("CC BY-SA 3.0 / GFDL", {"license": "cc-by-sa-3.0"}),  # the large sample's row
        ("CC BY-NC 4.0", {"license": "cc-by-nc-4.0"}),
        ("GPL-3.0 (authors' repository)", {"license": "other", "license_name": "gpl-3.0-authors-repository"}),
        ("not stated", {"license": "unknown"}),
        (None, {"license": "unknown"}),  # no MANIFEST row for the corpus
    ],
)
def test_the_weights_licence_is_the_training_texts_as_a_hub_id_else_other_or_unknown(manifest_licence, fields):
    assert weights_license(manifest_licence) == fields


def test_every_mapped_licence_is_a_hub_id_and_none_is_the_code_licence():
    assert all(hub_id == hub_id.lower() and " " not in hub_id for hub_id in CORPUS_LICENSE_IDS.values())
    assert CODE_LICENSE.lower() not in {*CORPUS_LICENSE_IDS.values(), weights_license(None)["license"]}


def test_a_card_without_a_known_corpus_says_unknown_terms_and_still_states_the_code_licence():
    card = model_card(config_from_preset("nano", objective="mlm"), {"step": 1, "total_steps": 1}, None, "tiny-mlm")
    header, body = header_and_body(card)
    assert header["license"] == "unknown"
    licence = body.split("## Licence", 1)[1]
    assert "terms unknown" in licence and f"Code in this folder: {CODE_LICENSE}" in licence


@pytest.mark.parametrize(
    ("name", "sentence"), [("mlm", "A flat masked-language-model (MLM) text encoder"), ("crossbert", "A CrossBERT text encoder")]
)
def test_the_card_names_its_objective_as_people_do(name, sentence):
    assert name in objective_names()
    _, body = header_and_body(model_card(config_from_preset("nano", objective=name), {}, None, name))
    assert sentence in body and f"A {name} text encoder" not in body  # not the config key
