"""The text-attributed graph generator (``generate tag``) and ``/node/text`` in the dataset format."""
from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest

from data_io.dataset import DatasetWriter, GraphData, open_dataset, write_dataset
from data_io.errors import FormatError
from data_io.generators import GeneratorParamError, generate_tag, write_tag
from data_io.generators.tag import COMMUNITY_WORDS, TOPICS, tag_vocabulary


def _topic_of(text: str, topics: int) -> set[int]:
    words = set(text.split())
    return {t for t, name in enumerate(list(TOPICS)[:topics]) if words & set(TOPICS[name])}


def test_labels_follow_community_and_text_topic():
    g = generate_tag(400, communities=3, topics=4, seed=3)
    assert g.num_classes == 12 and len(g.text) == 400
    topic, community = g.label % 4, g.label // 4
    for v in range(g.num_nodes):
        assert _topic_of(g.text[v], 4) == {int(topic[v])}  # the text names exactly its node's topic
        assert len(g.text[v].split()) == 14
    # the graph is homophilous in the communities (default 0.9 of the edges inside one)
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    inside = np.mean(community[dst] == community[g.indices])
    assert 0.85 < inside < 0.95


def test_bag_of_words_counts_the_vocabulary_words():
    g = generate_tag(200, communities=2, topics=3, topic_visible=0.25, seed=1)
    vocab = tag_vocabulary(3, 2, 0.25)
    want = np.zeros((200, len(vocab)), dtype=np.float32)
    for v, text in enumerate(g.text):
        toks = text.split()
        for w in toks:
            if w in vocab:
                want[v, vocab.index(w)] += 1.0 / len(toks)
    np.testing.assert_allclose(g.feat, want, rtol=1e-6)
    # only the first quarter of each topic list is visible in the features
    for name in list(TOPICS)[:3]:
        assert set(TOPICS[name][:4]) <= set(vocab) and not set(TOPICS[name][4:]) & set(vocab)


def test_community_mentions_are_noisy_at_the_given_rate():
    g = generate_tag(3000, communities=4, topics=2, community_mention=0.6, community_signal=0.5, seed=2)
    community = g.label // 2
    named = own = 0
    for v, text in enumerate(g.text):
        hits = [c for c in range(4) if set(text.split()) & set(COMMUNITY_WORDS[c])]
        if hits:
            named += 1
            own += hits == [community[v]]
    assert abs(named / 3000 - 0.6) < 0.04
    assert abs(own / named - (0.5 + 0.5 / 4)) < 0.05  # own community, or a random one that happens to be it


def test_same_seed_same_graph_and_texts():
    a, b, c = generate_tag(150, seed=5), generate_tag(150, seed=5), generate_tag(150, seed=6)
    assert a.text == b.text and np.array_equal(a.indices, b.indices) and np.array_equal(a.feat, b.feat)
    assert a.text != c.text


@pytest.mark.parametrize("kwargs, param", [({"communities": 9}, "communities"), ({"topics": 0}, "topics"),
                                            ({"num_nodes": 10, "communities": 4, "topics": 5}, "num_nodes"),
                                            ({"topic_visible": 1.5}, "topic_visible"),
                                            ({"words": 3, "topic_words": 4}, "words")])
def test_bad_arguments_name_the_parameter(kwargs, param):
    args = {"num_nodes": 100, **kwargs}
    with pytest.raises(GeneratorParamError) as exc:
        generate_tag(**args)
    assert exc.value.param == param


def test_text_round_trips_through_the_file(tmp_path):
    texts = ["héllo wörld ✓", "", "a" * 5000, "line\nbreak"]
    g = GraphData(indptr=np.array([0, 1, 2, 2, 3]), indices=np.array([1, 0, 2], dtype=np.int32), text=texts,
                  name="t")
    write_dataset(tmp_path / "t.h5", g)
    with open_dataset(tmp_path / "t.h5") as ds:
        assert ds.has("text") and ds.text() == texts and ds.text(1, 3) == texts[1:3]
        assert ds.load().text == texts
    with h5py.File(tmp_path / "t.h5") as f:
        assert h5py.check_string_dtype(f["node/text"].dtype).encoding == "utf-8"


def test_bad_text_is_refused_and_leaves_no_file(tmp_path):
    out = tmp_path / "bad.h5"
    with pytest.raises(FormatError, match="/node/text"):
        with DatasetWriter(out, num_nodes=3) as w:
            w.write_graph(np.array([0, 0, 0, 0]), np.array([], dtype=np.int32))
            w.write_text(["a", "b"])
    assert not out.exists()
    with pytest.raises(FormatError, match="node 1: expected str"):
        with DatasetWriter(out, num_nodes=2) as w:
            w.write_graph(np.array([0, 0, 0]), np.array([], dtype=np.int32))
            w.write_text(["a", 3])
    assert not out.exists()
    with h5py.File(out, "w") as f:  # a fixed-length byte array is not the format
        f.attrs.update(format="hpc_graph.dataset", version=1, name="x", task="node", num_nodes=2, num_edges=0,
                       num_classes=0, directed=False)
        f["graph/indptr"] = np.zeros(3, dtype=np.int64)
        f["graph/indices"] = np.zeros(0, dtype=np.int32)
        f["node/text"] = np.array([b"ab", b"cd"])
    with pytest.raises(FormatError, match="/node/text.*variable-length"):
        open_dataset(out)


def test_missing_text_names_the_field(tmp_path):
    write_dataset(tmp_path / "g.h5", GraphData(indptr=np.array([0, 0]), indices=np.zeros(0, dtype=np.int32)))
    with open_dataset(tmp_path / "g.h5") as ds, pytest.raises(FormatError, match="/node/text.*missing"):
        ds.text()


def test_cli_generate_tag(tmp_path):
    out = tmp_path / "tag.h5"
    proc = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "generate", "tag", "-o", str(out), "--num-nodes",
                           "300", "--communities", "2", "--topics", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "node text" in proc.stdout
    with open_dataset(out) as ds:
        assert ds.num_classes == 6 and len(ds.text()) == 300
    bad = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "generate", "tag", "-o", str(tmp_path / "b.h5"),
                          "--topics", "12"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--topics" in bad.stderr and not (tmp_path / "b.h5").exists()


def test_write_tag_refuses_what_cannot_fit(tmp_path, monkeypatch):
    from data_io.memory import MemoryRefusal

    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "64MB")
    with pytest.raises(MemoryRefusal):
        write_tag(tmp_path / "big.h5", num_nodes=2_000_000)
    assert not (tmp_path / "big.h5").exists()
