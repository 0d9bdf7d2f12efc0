"""Text-attributed graphs (TAG) whose labels need both the text and the structure.

Every node has a *community* ``c`` (the graph: a stochastic block model with
``homophily`` of its edges inside a community) and a *topic* ``t`` (its text),
drawn independently; its label is ``c * topics + t``. The node's text is a
short English sentence mixing

* ``topic_words`` words from its topic's word list (the topic is plain in the text),
* with probability ``community_mention``, one word of a community's word list --
  its own community's with probability ``community_signal``, otherwise a random
  community's (so the text alone says little about the community),
* filler words.

The bag-of-words features (``/node/feat``) count the words of a vocabulary made
of the filler words, the community words and only the first
``ceil(topic_visible * len)`` words of each topic list: most topic words are
missing from them, so a model on the features (however well it reads the
graph) finds the topic only for some nodes, while a language model reading
``/node/text`` sees every topic word. Hence, with the defaults:

* text alone (an MLP on the text's encoding): the topic, but the community only
  from a rare, noisy mention;
* structure alone (a GNN on the bag-of-words features): the community, from the
  neighbours' mentions, but the topic only when a visible topic word was drawn;
* both (a GNN on features and text encodings): both.

The word lists are fixed English words so that a pretrained sentence encoder
(all-MiniLM-L6-v2) separates the topics without fine-tuning.
"""
from __future__ import annotations

import logging
import math
import os

import numpy as np

from data_io.dataset import GraphData, write_dataset
from data_io.errors import check_output
from data_io.generators._common import (
    STREAM_FEAT, STREAM_LABEL, GeneratorParamError, check_float, check_int, check_seed, check_split, rng_for,
)
from data_io.memory import MIB, require_memory

log = logging.getLogger(__name__)

#: topic word lists (the first words of each list are the ones the bag-of-words features keep)
TOPICS: dict[str, tuple[str, ...]] = {
    "sport": ("match", "goal", "coach", "league", "stadium", "tournament", "striker", "referee", "season",
              "championship", "athlete", "trophy", "penalty", "defender", "scoreboard", "playoff"),
    "cooking": ("recipe", "oven", "flour", "simmer", "garlic", "butter", "kitchen", "dessert", "spices",
                "bake", "sauce", "onion", "roast", "dough", "chef", "vinegar"),
    "astronomy": ("galaxy", "telescope", "orbit", "planet", "nebula", "comet", "asteroid", "supernova",
                  "eclipse", "stars", "cosmic", "meteor", "satellite", "lunar", "gravity", "quasar"),
    "music": ("guitar", "melody", "concert", "album", "chord", "rhythm", "singer", "orchestra", "piano",
              "lyrics", "drummer", "symphony", "tempo", "violin", "chorus", "jazz"),
    "finance": ("stock", "bank", "interest", "investor", "dividend", "market", "loan", "inflation", "bond",
                "portfolio", "currency", "mortgage", "profit", "revenue", "shares", "budget"),
    "medicine": ("doctor", "patient", "vaccine", "surgery", "hospital", "symptoms", "therapy", "clinic",
                 "diagnosis", "nurse", "infection", "medicine", "dose", "fever", "virus", "treatment"),
    "weather": ("rain", "storm", "forecast", "humidity", "thunder", "snowfall", "wind", "cloudy", "drought",
                "temperature", "hurricane", "frost", "sunny", "fog", "tornado", "rainfall"),
    "computing": ("software", "compiler", "processor", "database", "algorithm", "server", "keyboard",
                  "network", "debug", "memory", "kernel", "browser", "code", "laptop", "encryption", "cloud"),
}
#: community word lists (place words: a community's mentions are its own words, or noise)
COMMUNITY_WORDS: tuple[tuple[str, ...], ...] = (
    ("harbor", "lighthouse", "pier"), ("canyon", "mesa", "cactus"), ("glacier", "fjord", "tundra"),
    ("vineyard", "meadow", "orchard"), ("volcano", "lava", "crater"), ("marsh", "swamp", "bayou"),
    ("prairie", "ranch", "silo"), ("jungle", "rainforest", "canopy"),
)
FILLER: tuple[str, ...] = (
    "the", "a", "of", "and", "in", "on", "with", "for", "about", "new", "report", "people", "today", "this",
    "week", "story", "city", "some", "many", "after", "before", "local", "during", "great", "small", "long",
    "first", "last", "group", "friends", "article", "notes", "thoughts", "yesterday", "morning", "evening",
)


def _check_args(num_nodes, communities, topics, avg_degree, homophily, topic_words, topic_visible,
                community_mention, community_signal, words, fractions, seed):
    num_nodes = check_int("num_nodes", num_nodes, 1, 2**31 - 1)
    communities = check_int("communities", communities, 1, len(COMMUNITY_WORDS))
    topics = check_int("topics", topics, 1, len(TOPICS))
    if communities * topics > num_nodes:
        raise GeneratorParamError("num_nodes", f"{communities * topics} classes (communities x topics) for only "
                                  f"{num_nodes} nodes")
    avg_degree = check_float("avg_degree", avg_degree, 0.0, float(num_nodes - 1))
    homophily = check_float("homophily", homophily, 0.0, 1.0)
    if communities == 1 and homophily < 1.0:
        homophily = 1.0
    topic_words = check_int("topic_words", topic_words, 1, 64)
    topic_visible = check_float("topic_visible", topic_visible, 0.0, 1.0)
    community_mention = check_float("community_mention", community_mention, 0.0, 1.0)
    community_signal = check_float("community_signal", community_signal, 0.0, 1.0)
    words = check_int("words", words, topic_words + 1, 512)
    return (num_nodes, communities, topics, avg_degree, homophily, topic_words, topic_visible,
            community_mention, community_signal, words, check_split(*fractions), check_seed(seed))


def tag_vocabulary(topics: int, communities: int, topic_visible: float) -> list[str]:
    """The bag-of-words vocabulary (feature column order): filler, community words, visible topic words."""
    vocab = list(dict.fromkeys(FILLER))
    for c in range(communities):
        vocab += COMMUNITY_WORDS[c]
    for name in list(TOPICS)[:topics]:
        lst = TOPICS[name]
        vocab += lst[:int(math.ceil(topic_visible * len(lst)))]
    return list(dict.fromkeys(vocab))


def estimate_tag_bytes(num_nodes: int, avg_degree: float = 10.0, words: int = 16) -> int:
    """Peak memory of :func:`write_tag` in bytes (an upper bound): the CSBM graph (about 120 bytes per
    undirected edge while pairs are drawn), the texts as Python strings (about 60 + 8 bytes per word
    and node) and the float32 features (vocabulary of at most 200 words), plus 32 MiB."""
    n = int(num_nodes)
    m = int(round(n * float(avg_degree) / 2))
    return 120 * m + 64 * n + n * (60 + 8 * int(words)) + 4 * 200 * n + 32 * MIB


def generate_tag(num_nodes: int = 10000, communities: int = 4, topics: int = 5, *, avg_degree: float = 10.0,
                 homophily: float = 0.9, topic_words: int = 4, topic_visible: float = 0.2,
                 community_mention: float = 0.5, community_signal: float = 0.5, words: int = 14,
                 train_frac: float = 0.6, val_frac: float = 0.2, test_frac: float = 0.2,
                 seed: int = 0) -> GraphData:
    """Generate a text-attributed graph in memory (see the module docstring).

    Args:
        num_nodes: N.
        communities: K in [1, 8] graph communities; topics: T in [1, 8] text topics; C = K * T classes.
        avg_degree, homophily: the community graph (a CSBM, :func:`~data_io.generators.generate_csbm`).
        topic_words: topic words per text; words: words per text (>= topic_words + 1).
        topic_visible: fraction of each topic's 16 words kept in the bag-of-words vocabulary.
        community_mention: probability that a text names a community place word;
        community_signal: probability that the named community is the node's own.
        train_frac, val_frac, test_frac: random split; seed: equal seeds give equal graphs and texts.

    Returns:
        :class:`GraphData` with ``text`` (list of N str), ``feat`` float32[N, V] (word counts / words,
        V = len(:func:`tag_vocabulary`)), ``label = community * T + topic``.
    """
    args = _check_args(num_nodes, communities, topics, avg_degree, homophily, topic_words, topic_visible,
                       community_mention, community_signal, words, (train_frac, val_frac, test_frac), seed)
    return _build(*args)


def _build(n, k, t, avg_degree, homophily, topic_words, topic_visible, mention, signal, words, fractions, seed
           ) -> GraphData:
    from data_io.generators.csbm import generate_csbm

    # the graph, its communities and the split: a CSBM with K classes (no features)
    g = generate_csbm(n, k, avg_degree=avg_degree, homophily=homophily, feat_dim=0, train_frac=fractions[0],
                      val_frac=fractions[1], test_frac=fractions[2], seed=seed)
    community = g.label
    topic = rng_for(seed, STREAM_LABEL, 1).integers(0, t, size=n)
    rng = rng_for(seed, STREAM_FEAT, 1)
    topic_lists = [TOPICS[name] for name in list(TOPICS)[:t]]
    filler = np.array(FILLER)
    named = rng.random(n) < mention
    own = rng.random(n) < signal
    other = rng.integers(0, k, size=n)
    texts: list[str] = []
    for v in range(n):
        lst = topic_lists[topic[v]]
        ws = [lst[i] for i in rng.choice(len(lst), size=topic_words, replace=False)]
        if named[v]:
            c = community[v] if own[v] else other[v]
            ws.append(COMMUNITY_WORDS[c][rng.integers(0, len(COMMUNITY_WORDS[c]))])
        ws += list(filler[rng.integers(0, len(filler), size=words - len(ws))])
        rng.shuffle(ws)
        texts.append(" ".join(ws))
    vocab = tag_vocabulary(t, k, topic_visible)
    col = {w: i for i, w in enumerate(vocab)}
    feat = np.zeros((n, len(vocab)), dtype=np.float32)
    for v, text in enumerate(texts):
        toks = text.split()
        for w in toks:
            j = col.get(w)
            if j is not None:
                feat[v, j] += 1.0
        feat[v] /= len(toks)
    label = community.astype(np.int64) * t + topic.astype(np.int64)
    g.name = f"tag-n{n}-k{k}-t{t}"
    g.feat, g.label, g.text, g.num_classes = feat, label, texts, k * t
    log.info("tag: %d nodes, %d edges, %d communities x %d topics, %d-word vocabulary", n, g.num_edges, k, t,
             len(vocab))
    return g


def write_tag(path: str | os.PathLike, num_nodes: int = 10000, communities: int = 4, topics: int = 5, *,
              avg_degree: float = 10.0, homophily: float = 0.9, topic_words: int = 4, topic_visible: float = 0.2,
              community_mention: float = 0.5, community_signal: float = 0.5, words: int = 14,
              train_frac: float = 0.6, val_frac: float = 0.2, test_frac: float = 0.2, seed: int = 0,
              force: bool = False) -> dict[str, int]:
    """:func:`generate_tag` straight into a dataset file (atomically; memory checked first, as every
    generator). Returns ``{"num_nodes", "num_edges", "feat_dim"}``."""
    args = _check_args(num_nodes, communities, topics, avg_degree, homophily, topic_words, topic_visible,
                       community_mention, community_signal, words, (train_frac, val_frac, test_frac), seed)
    check_output(path, force)
    require_memory(estimate_tag_bytes(args[0], args[3], args[9]),
                   f"generate tag --num-nodes {args[0]} --avg-degree {args[3]:g}", force=force,
                   hint="use a smaller --num-nodes or --avg-degree")
    g = _build(*args)
    write_dataset(path, g, force=force)
    return {"num_nodes": g.num_nodes, "num_edges": g.num_edges, "feat_dim": g.feat_dim}
