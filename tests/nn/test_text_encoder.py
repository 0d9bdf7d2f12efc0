"""The BERT text encoder with early exits against Hugging Face's BertModel (the reference) and by hand."""
from __future__ import annotations

import json
import math

import pytest
import torch

from hpc_graph.nn.text_encoder import (
    BertConfig, BertEncoder, EarlyExitLM, WordTokenizer, exit_layers, load_text_encoder,
)

transformers = pytest.importorskip("transformers")  # a dev dependency: installed by the test command

CFG = dict(vocab_size=60, hidden_size=24, num_hidden_layers=4, num_attention_heads=3, intermediate_size=40,
           max_position_embeddings=32)


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    ref = transformers.BertModel(transformers.BertConfig(**CFG, hidden_dropout_prob=0.0,
                                                         attention_probs_dropout_prob=0.0),
                                 add_pooling_layer=False).double().eval()
    ours = BertEncoder(BertConfig(**CFG)).double().eval()
    ours.load_state_dict({k: v for k, v in ref.state_dict().items() if "position_ids" not in k})
    return ref, ours


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, CFG["vocab_size"], (5, 11), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([11, 7, 1, 4, 9]):
        mask[row, length:] = 0
        ids[row, length:] = 0
    return ids, mask


def test_hidden_states_equal_hugging_face_bert():
    ref, ours = _pair()
    ids, mask = _batch()
    want = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    got = ours(ids, mask)
    assert len(got) == len(want) == 5
    keep = mask.bool()
    for a, b in zip(got, want):
        torch.testing.assert_close(a[keep], b[keep], rtol=1e-10, atol=1e-10)


def test_early_exit_runs_only_its_layers_and_pools_tokens():
    _, enc = _pair()
    lm = EarlyExitLM(enc, exits=2, num_classes=3, emb_dim=5).double().eval()
    assert lm.exit_layers == [2, 4]
    ids, mask = _batch()
    calls = []
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: calls.append(k)) for k, layer in
             enumerate(enc.encoder.layer)]
    emb = lm.embed(ids, mask, 0)
    assert calls == [0, 1]  # the exit leaves after two of four layers
    for h in hooks:
        h.remove()
    hidden = enc(ids, mask)[2]
    m = mask.double().unsqueeze(-1)
    want = lm.heads[0]((hidden * m).sum(1) / m.sum(1))
    torch.testing.assert_close(emb, want)
    torch.testing.assert_close(lm(ids, mask, 1), lm.classifier(lm.embed(ids, mask, 1)))


@pytest.mark.parametrize("layers, exits", [(6, 4), (4, 4), (12, 5), (3, 1)])
def test_exit_layers(layers, exits):
    got = exit_layers(layers, exits)
    assert got == [math.ceil(layers * (i + 1) / exits) for i in range(exits)] and got[-1] == layers
    assert all(a < b for a, b in zip(got, got[1:]))


def test_too_many_exits_is_refused():
    with pytest.raises(ValueError, match="lm.exits"):
        exit_layers(4, 5)


def test_word_tokenizer():
    tok = WordTokenizer.from_texts(["the cat sat", "The dog, the cat"])
    ids, mask = tok.encode(["the cat", "unknown dog sat on the mat", ""], max_length=5)
    v = tok.vocab
    assert v["the"] == 4  # most frequent word first, after the four special tokens
    assert ids[0].tolist() == [2, v["the"], v["cat"], 3, 0]
    assert ids[1].tolist() == [2, 1, v["dog"], v["sat"], 3]  # cut to max_length, unknown -> [UNK]
    assert ids[2].tolist()[:2] == [2, 3] and mask.sum(1).tolist() == [4, 5, 2]


def test_checkpoint_folder_round_trip(tmp_path):
    from safetensors.torch import save_file

    _, enc = _pair(3)
    (tmp_path / "config.json").write_text(json.dumps({**CFG, "model_type": "bert", "hidden_act": "gelu"}))
    save_file({("bert." + k): v.float().contiguous() for k, v in enc.state_dict().items()},
              str(tmp_path / "model.safetensors"))
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hello": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded, ptok = load_text_encoder(str(tmp_path))
    for k, v in enc.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v.float())
    ids, mask = ptok.encode(["hello there", "hello"], 8)
    assert ids.tolist() == [[2, 1], [2, 0]] and mask.tolist() == [[1, 1], [1, 0]]


def test_bad_model_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_text_encoder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**CFG, "model_type": "roberta"}))
    with pytest.raises(ValueError, match="BERT"):
        load_text_encoder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**CFG, "model_type": "bert"}))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_text_encoder(str(tmp_path))
    with pytest.raises(ValueError, match="vocabulary from the texts"):
        load_text_encoder("tiny")


def test_untuned_exits_give_the_mean_pooled_state():
    _, enc = _pair(5)
    lm = EarlyExitLM(enc, exits=4, num_classes=2).double().eval()  # emb_dim = hidden: identity heads
    ids, mask = _batch(2)
    for e, layer in enumerate(lm.exit_layers):
        h = enc(ids, mask)[layer]
        m = mask.double().unsqueeze(-1)
        torch.testing.assert_close(lm.embed(ids, mask, e), (h * m).sum(1) / m.sum(1))
