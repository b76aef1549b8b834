"""Why a CrossBERT stays on the unigram plateau: what its checkpoints still know about token identity, and where
its predictor looks (results/escape_scan/README.md, "Mechanism").

    python experiments/escape_scan/collapse.py CHECKPOINT [CHECKPOINT ...] > table.md

For each checkpoint (flat MLM or CrossBERT), on 32 Wikipedia documents of at least 600 characters (the same
documents for every checkpoint, cut to 128 tokens), one Markdown row:

* input embeddings: participation ratio of the mean-centred embedding matrix, (sum s^2)^2 / sum s^4 over its
  singular values s (1 = one direction holds all the variance; about 124 for the 4,096 x 128 matrix at
  initialisation);
* every layer's features (the encoder on the whole sequence, as frozen probes see it): the same centred
  participation ratio over tokens, and "self top-1", the share of tokens whose own input embedding has the
  largest dot product with the feature among all 4,096 (how much token identity the layer still carries);
* CrossBERT only: the predictor's first cross-attention on two complementary halves of each document (a random
  half visible), its attention mass on the visible tokens at distance <= 1 from the query (uniform attention
  would put about 1.6% there) and the most attended offset's shares.
"""

import itertools
import math
import sys
from pathlib import Path

import torch
from transformers import AutoModel

from crossbert_model.data.corpus import iter_documents
from crossbert_model.data.tokenizer import load_tokenizer
from crossbert_model.masking import crossbert_packing
from crossbert_model.model import CrossBertForPreTraining, apply_rotary
from crossbert_model.remote_code import from_pretrained
from crossbert_model.utils import data_root

DOCUMENTS, MIN_CHARS, SEQ_LEN = 32, 600, 128


def documents() -> list[str]:
    corpus = iter_documents(str(data_root() / "wikipedia_en_2015"))
    return list(itertools.islice((d for d in corpus if len(d) >= MIN_CHARS), DOCUMENTS))


def participation_ratio(x: torch.Tensor) -> float:
    s = torch.linalg.svdvals(x.float() - x.float().mean(0))
    return float((s**2).sum() ** 2 / (s**4).sum())


def layer_columns(encoder, ids: torch.Tensor) -> list[str]:
    embeddings = encoder.get_input_embeddings().weight
    with torch.no_grad():
        states = encoder(ids, output_hidden_states=True).hidden_states
    cells = []
    for x in states:
        x = x.reshape(-1, x.shape[-1])
        self_top1 = float(((x @ embeddings.T).argmax(-1) == ids.reshape(-1)).float().mean())
        cells.append(f"{participation_ratio(x):.1f} / {100 * self_top1:.0f}%")
    return cells


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(rows, tokens, width) -> (rows, heads, tokens, width / heads), as the model's attention splits them."""
    return x.view(*x.shape[:2], heads, -1).transpose(1, 2)


def predictor_attention(model: CrossBertForPreTraining, ids: torch.Tensor) -> tuple[float, str]:
    """Attention mass at distance <= 1 and the top argmax offsets of the predictor's first cross-attention."""
    b, t = ids.shape
    order = torch.rand(b, t, generator=torch.Generator().manual_seed(0)).argsort(-1)
    half = torch.zeros(b, t, dtype=torch.bool).scatter_(1, order[:, : t // 2], True)
    visible = torch.stack([half, ~half], 1)
    packed = crossbert_packing(visible, None)
    queries_at, keys_at = packed["query_positions"].reshape(2 * b, -1), packed["encoder_positions"].reshape(2 * b, -1)
    with torch.no_grad():
        context = model.encoder(torch.gather(ids.repeat_interleave(2, 0), 1, keys_at), position_ids=keys_at).last_hidden_state
        predictor, attn = model.predictor, model.predictor.layers[0].attn
        queries = predictor.mask_embedding.expand(2 * b, queries_at.shape[1], -1)
        rope_q, rope_k = predictor.rotary(queries_at), predictor.rotary(keys_at)
        q = apply_rotary(split_heads(attn.q_proj(predictor.layers[0].attn_norm(queries)), attn.num_heads), *rope_q)
        k = apply_rotary(split_heads(attn.kv_proj(context).chunk(2, -1)[0], attn.num_heads), *rope_k)
        weights = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)  # (rows, heads, queries, keys)
    offset = keys_at[:, None, None, :] - queries_at[:, None, :, None]
    near = float((weights * (offset.abs() <= 1)).sum(-1).mean())
    top = torch.gather(offset.expand_as(weights), -1, weights.argmax(-1, keepdim=True)).clamp(-6, 6)
    values, counts = torch.unique(top, return_counts=True)
    shares = sorted(zip(counts.tolist(), values.tolist()), reverse=True)[:3]
    label = {-6: "<=-6", 6: ">=6"}
    return near, ", ".join(f"{label.get(v, f'{v:+d}')}: {100 * c / top.numel():.0f}%" for c, v in shares)


def main(checkpoints: list[str]) -> None:
    texts = documents()
    rows = []
    for path in checkpoints:
        tokenizer = load_tokenizer(path)
        ids = tokenizer(texts, truncation=True, max_length=SEQ_LEN, return_tensors="pt")["input_ids"]
        encoder = from_pretrained(AutoModel, path, trust_remote_code=False).eval()
        cells = layer_columns(encoder, ids)
        attention = "-", "-"
        if encoder.config.objective == "crossbert":
            model = from_pretrained(CrossBertForPreTraining, path, trust_remote_code=False).eval()
            near, offsets = predictor_attention(model, ids)
            attention = f"{100 * near:.0f}%", offsets
        embeddings = participation_ratio(encoder.get_input_embeddings().weight.detach())
        name = "/".join(Path(path).parts[-3::2])  # run/step_N
        rows.append(f"| {name} | {embeddings:.1f} | " + " | ".join(cells) + f" | {attention[0]} | {attention[1]} |")
    layers = len(cells)
    print(
        "| checkpoint | embeddings: centred PR | "
        + " | ".join(f"layer {i}: PR / self top-1" for i in range(layers))
        + " | predictor attention at distance <= 1 | most attended offsets |"
    )
    print("|---" * (layers + 4) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
