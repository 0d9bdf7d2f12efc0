"""Config loading: defaults, overrides, and one named error per bad field."""
import dataclasses

import pytest
import yaml

from hpc_graph.train.config import (Config, ConfigError, check_paths, config_from_dict, config_to_dict,
                                    load_config, validate_config)


def _write(tmp_path, data, name="c.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_defaults_and_round_trip(tmp_path):
    cfg = load_config(_write(tmp_path, {"data": {"path": "g.h5"}}))
    assert isinstance(cfg, Config)
    assert cfg.data.path == "g.h5" and cfg.data.feature_norm == "none" and cfg.data.feature_layout == "auto"
    assert cfg.engine.name == "auto" and cfg.engine.prefetch is True
    assert (cfg.model.name, cfg.model.hidden, cfg.model.num_layers) == ("gcn", 16, 2)
    assert cfg.optim.name == "adam" and cfg.train.epochs == 200 and cfg.train.run_dir is None
    d = config_to_dict(cfg)
    assert set(d) == {"data", "engine", "model", "optim", "train", "comm", "sampler", "hec", "recipes", "lm"}
    assert cfg.comm.link_bandwidth is None and cfg.engine.bits == "auto" and cfg.engine.pipeline == "off"
    assert config_from_dict(d) == cfg
    assert validate_config(cfg) == cfg


def test_on_and_off_survive_yaml(tmp_path):
    """YAML 1.1 reads a bare on/off as true/false; the pipeline field takes them as the words."""
    cfg = load_config(_write(tmp_path, {"data": {"path": "g.h5"}}), ["engine.name=sylvie", "engine.pipeline=on"])
    assert cfg.engine.pipeline == "on"
    path = tmp_path / "c.yaml"
    path.write_text("data: {path: g.h5}\nengine: {name: sylvie, pipeline: off}\n")
    assert load_config(path).engine.pipeline == "off"


def test_full_file_and_overrides(tmp_path):
    raw = {"data": {"path": "x.h5", "feature_norm": "row"}, "engine": {"name": "sar", "prefetch": False},
           "model": {"name": "gat", "hidden": 8, "heads": 4, "attn_dropout": 0.6, "dropout": 0.6},
           "optim": {"name": "sgd", "lr": "5e-3", "weight_decay": 5e-4, "momentum": 0.9, "schedule": "step",
                     "step_size": 10, "gamma": 0.1},
           "train": {"epochs": 3, "seed": 7, "dtype": "float64", "run_dir": "runs/a", "progress": False}}
    cfg = load_config(_write(tmp_path, raw), ["model.hidden=32", "optim.lr=1e-2", "train.progress=true",
                                              "engine.name=sar", "train.run_dir=runs/b"])
    assert cfg.model.hidden == 32 and cfg.model.heads == 4 and cfg.model.attn_dropout == 0.6
    assert cfg.optim.lr == pytest.approx(0.01) and isinstance(cfg.optim.lr, float)
    assert cfg.optim.schedule == "step" and cfg.optim.momentum == 0.9
    assert cfg.train.progress is True and cfg.train.dtype == "float64" and cfg.train.run_dir == "runs/b"
    assert cfg.engine.name == "sar" and cfg.engine.prefetch is False and cfg.data.feature_norm == "row"
    with pytest.raises(ConfigError, match=r"engine\.prefetch: only used by engine 'sar', but engine\.name is 'dp'"):
        load_config(_write(tmp_path, raw), ["engine.name=dp"])  # another engine's option, not at its default


def test_gat_projection_reaches_every_layer():
    from hpc_graph.nn import GATConv
    from hpc_graph.nn.models import build_from_config

    cfg = config_from_dict({"data": {"path": "x.h5"}, "model": {"name": "gat", "gat_projection": "relu"}})
    model = build_from_config(cfg.model, 7, 3)
    convs = [m for m in model.modules() if isinstance(m, GATConv)]
    assert len(convs) == cfg.model.num_layers and all(c.projection == "relu" and c.bias is None for c in convs)


BAD = [
    ({"model": {"hidden": -3}}, "model.hidden: must be a positive integer, got -3"),
    ({"model": {"hidden": 2.5}}, "model.hidden: must be a positive integer, got 2.5"),
    ({"model": {"hidden": True}}, "model.hidden: must be a positive integer, got True"),
    ({"model": {"num_layers": 0}}, "model.num_layers: must be a positive integer"),
    ({"model": {"name": "gin"}}, "model.name: must be one of 'gcn', 'sage', 'gat', 'gcn2', 'jknet', 'appnp', 'sgc', "
                                  "'dagnn', 'mlp', 'rgcn', 'revgcn', 'revgat', 'gt', 'graphormer', got 'gin'"),
    ({"model": {"name": "gt", "attention": "often"}}, "model.attention: must be one of 'sparse', 'dense', "
                                                        "'every_k_steps', 'dense_layers', got 'often'"),
    ({"model": {"name": "gt", "dense_layers": [0, -1]}}, "model.dense_layers: must be a list of layer indices"),
    ({"model": {"name": "graphormer", "dense_every": 0}}, "model.dense_every: must be a positive integer"),
    ({"model": {"name": "gcn", "pe_dim": 4}}, "model.pe_dim: only used by model 'gt'"),
    ({"model": {"name": "sage", "far_prior": False}}, "model.far_prior: only used by model 'gt' or 'graphormer'"),
    ({"model": {"name": "gt", "far_prior": "no"}}, "model.far_prior: must be true or false"),
    ({"model": {"name": "gt", "max_degree": 4}}, "model.max_degree: only used by model 'graphormer'"),
    ({"model": {"name": "gt"}, "engine": {"name": "dp"}}, "it needs model.attention: sparse, global_token: false, "
     "pe_dim: 0"),
    ({"model": {"name": "gt"}, "engine": {"name": "minibatch"}}, "model.name: 'gt' runs on engine.name 'single' or "
     "'seqpar', not 'minibatch'"),
    ({"model": {"name": "gt", "pe_dim": 0}, "engine": {"name": "minibatch"}}, "model.name: 'gt' runs on engine.name "
     "'single' or 'dp' or 'sar' or 'sylvie' or 'seqpar', not 'minibatch'"),  # the engines that take this config
    ({"model": {"name": "graphormer"}, "engine": {"name": "sar"}}, "model.name: 'graphormer' runs on engine.name "
     "'single' or 'seqpar', not 'sar'"),
    ({"model": {"name": "gt"}, "engine": {"name": "dp", "attention_chain": False}},
     "engine.attention_chain: only used by engine 'single' or 'seqpar'"),
    ({"model": {"name": "gt"}, "engine": {"cluster_beta": 3}}, "engine.cluster_beta: must be null, 'auto' or a "
     "number in [0, 1]"),
    ({"model": {"name": "gcn"}, "engine": {"name": "seqpar"}}, "engine.name: 'seqpar' runs the graph transformers"),
    ({"model": {"dropout": 1.0}}, "model.dropout: must be a number in [0, 1), got 1.0"),
    ({"model": {"attn_dropout": -0.1}}, "model.attn_dropout: must be a number in [0, 1)"),
    ({"model": {"name": "gat", "gat_projection": "tanh"}}, "model.gat_projection: must be one of 'linear', 'relu'"),
    ({"model": {"name": "sage", "gat_projection": "relu"}}, "model.gat_projection: only used by model 'gat'"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5], "feature_cache": 10}},
     "sampler.feature_cache: only used by hec.mode 'exact'"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5]}, "hec": {"policy": "lru"}},
     "hec.policy: must be one of 'ocf', 'set', got 'lru'"),
    ({"model": {"residual": "yes"}}, "model.residual: must be true or false, got 'yes'"),
    ({"model": {"heads": 0}}, "model.heads: must be a positive integer"),
    ({"model": {"out_heads": "two"}}, "model.out_heads: must be a positive integer"),
    ({"model": {"batchnorm": 1}}, "model.batchnorm: must be true or false"),
    ({"model": {"hiden": 3}}, "model.hiden: unknown key"),
    ({"data": {"feature_norm": "l2"}}, "data.feature_norm: must be one of 'none', 'row'"),
    ({"data": {"feature_layout": "coo"}}, "data.feature_layout: must be one of 'auto', 'dense', 'sparse'"),
    ({"data": {"path": ""}}, "data.path: must be a non-empty path string"),
    ({"data": {"path": 3}}, "data.path: must be a non-empty path string, got 3"),
    ({"data": {"feature_norm": "row"}, "drop_data_path": True}, "data.path: required"),
    ({"engine": {"name": "ddp"}}, "engine.name: must be one of 'auto', 'single', 'dp', 'sar', 'sylvie', "
                                  "'minibatch', 'apt', 'seqpar', 'flow', got 'ddp'"),
    ({"engine": {"name": "apt", "strategy": "p3"}}, "engine.strategy: must be one of 'auto', 'gdp', 'nfp', 'snp', "
                                                    "'dnp', got 'p3'"),
    ({"engine": {"name": "apt", "cache_mb": -1}}, "engine.cache_mb"),
    ({"engine": {"name": "dp", "strategy": "gdp"}}, "engine.strategy"),
    ({"engine": {"name": "apt", "strategy": "nfp"}, "model": {"name": "gat"}}, "engine.strategy: nfp splits"),
    ({"engine": {"name": "apt"}, "model": {"name": "gcn2"}}, "engine 'apt' runs the layer stacks"),
    ({"engine": {"name": "sylvie", "bits": 3}}, "engine.bits: must be one of 'auto', 1, 2, 4, 8, 32, got 3"),
    ({"engine": {"name": "sylvie", "bits": "16"}}, "engine.bits: must be one of 'auto', 1, 2, 4, 8, 32, got '16'"),
    ({"engine": {"name": "sylvie", "bits": True}}, "engine.bits: must be one of 'auto', 1, 2, 4, 8, 32, got True"),
    ({"engine": {"name": "sylvie", "pipeline": "always"}},
     "engine.pipeline: must be one of 'off', 'on', 'adaptive', got 'always'"),
    ({"engine": {"name": "sylvie", "scale_dtype": "int8"}},
     "engine.scale_dtype: must be one of 'float32', 'float16', got 'int8'"),
    ({"engine": {"name": "sylvie", "ldr_smoothing": 1.0}}, "engine.ldr_smoothing: must be a number in [0, 1)"),
    ({"engine": {"name": "sylvie", "ldr_window": 0}}, "engine.ldr_window: must be a positive integer, got 0"),
    ({"engine": {"name": "dp", "bits": 4}}, "engine.bits: only used by engine 'sylvie', but engine.name is 'dp'"),
    ({"engine": {"pipeline": "on"}}, "engine.pipeline: only used by engine 'sylvie', but engine.name is 'auto'"),
    ({"comm": {"link_bandwidth": -1}}, "comm.link_bandwidth: must be a non-negative finite bandwidth, got -1"),
    ({"comm": {"link_bandwidth": "fast"}}, "comm.link_bandwidth: cannot read 'fast'"),
    ({"comm": {"link_latency": "-5us"}}, "comm.link_latency: must be a non-negative finite latency"),
    ({"comm": {"speed": 1}}, "comm.speed: unknown key"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [10, 0]}},
     "sampler.fanouts: must be a non-empty list of positive integers (or -1 for all neighbours), got [10, 0]"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": "10,5"}},
     "sampler.fanouts: must be a non-empty list of positive integers"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": []}}, "sampler.fanouts: must be a non-empty list"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5, 5]}},
     "sampler.fanouts: one fan-out per model layer is needed (2 for model.num_layers), got [5, 5, 5]"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5], "batch_size": 0}},
     "sampler.batch_size: must be a positive integer, got 0"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5]}, "hec": {"mode": "cache"}},
     "hec.mode: must be one of 'exact', 'drop', 'hec', got 'cache'"),
    ({"engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5]}, "hec": {"delay": 0}},
     "hec.delay: must be a positive integer, got 0"),
    ({"engine": {"name": "dp"}, "hec": {"mode": "drop"}}, "hec.mode: only used by engine 'minibatch'"),
    ({"engine": {"name": "sylvie", "ldr_time": "cpu"}}, "engine.ldr_time: must be one of 'wall', 'epochs'"),
    ({"engine": {"prefetch": "no"}}, "engine.prefetch: must be true or false"),
    ({"optim": {"name": "rmsprop"}}, "optim.name: must be one of 'adam', 'sgd'"),
    ({"optim": {"lr": 0}}, "optim.lr: must be a positive number, got 0"),
    ({"optim": {"lr": "fast"}}, "optim.lr: must be a positive number, got 'fast'"),
    ({"optim": {"lr": float("nan")}}, "optim.lr: must be a positive number"),
    ({"optim": {"weight_decay": -1e-4}}, "optim.weight_decay: must be a non-negative number"),
    ({"optim": {"momentum": 1.5}}, "optim.momentum: must be a number in [0, 1)"),
    ({"optim": {"schedule": "linear"}}, "optim.schedule: must be one of 'none', 'step', 'cosine'"),
    ({"optim": {"step_size": 0}}, "optim.step_size: must be a positive integer"),
    ({"optim": {"gamma": 0}}, "optim.gamma: must be a number in (0, 1], got 0"),
    ({"train": {"epochs": 0}}, "train.epochs: must be a positive integer, got 0"),
    ({"train": {"seed": -1}}, "train.seed: must be a non-negative integer, got -1"),
    ({"train": {"eval_every": 0}}, "train.eval_every: must be a positive integer"),
    ({"train": {"device": "tpu"}}, "train.device: must be one of 'cpu', 'cuda', got 'tpu'"),
    ({"train": {"dtype": "float16"}}, "train.dtype: must be one of 'float32', 'float64'"),
    ({"train": {"comm_backend": "nccl"}}, "train.comm_backend: must be one of 'mpi', 'torch'"),
    ({"train": {"checkpoint_every": -2}}, "train.checkpoint_every: must be a non-negative integer"),
    ({"train": {"progress": 0}}, "train.progress: must be true or false"),
    ({"train": {"run_dir": ["a"]}}, "train.run_dir: must be a non-empty path string"),
    ({"train": ["epochs", 3]}, "train: must be a mapping"),
    ({"trainer": {"epochs": 3}}, "trainer: unknown section"),
]


@pytest.mark.parametrize("raw,message", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD)])
def test_each_bad_field_is_named(tmp_path, raw, message):
    raw = dict(raw)
    drop = raw.pop("drop_data_path", False)
    if not drop:
        raw.setdefault("data", {})
        if isinstance(raw["data"], dict):
            raw["data"] = {"path": "g.h5", **raw["data"]}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, raw))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override,message", [
    ("model.hidden=-3", "model.hidden: must be a positive integer, got -3"),
    ("model.hidden", "expected section.key=value"),
    ("hidden=3", "expected section.key=value"),
    ("a.b.c=1", "expected section.key=value"),
    ("modle.hidden=3", "modle: unknown section"),
    ("model.width=3", "model.width: unknown key"),
    ("train.device=gpu", "train.device: must be one of"),
])
def test_bad_overrides_are_named(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(_write(tmp_path, {"data": {"path": "g.h5"}}), [override])


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"invalid YAML at line 2, column 10: mapping values"):
        load_config(_write(tmp_path, "data:\n  path: a: b\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="data.path: required"):
        load_config(_write(tmp_path, ""))


def test_validate_config_rejects_bad_values_set_in_code(tmp_path):
    cfg = load_config(_write(tmp_path, {"data": {"path": "g.h5"}}))
    bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden=0))
    with pytest.raises(ConfigError, match="model.hidden"):
        validate_config(bad)


def test_check_paths(tmp_path):
    cfg = load_config(_write(tmp_path, {"data": {"path": str(tmp_path / "nope.h5")}}))
    with pytest.raises(ConfigError, match="data.path: no such file or directory"):
        check_paths(cfg)
    (tmp_path / "g.h5").write_bytes(b"")
    check_paths(load_config(_write(tmp_path, {"data": {"path": str(tmp_path / "g.h5")}})))


@pytest.mark.parametrize("raw, match", [
    ({"lm": {"lr": 0.1}}, r"lm\.lr: only used with lm\.enabled"),
    ({"engine": {"name": "dp"}, "lm": {"enabled": True}}, r"lm\.enabled: .*'single' or 'flow'"),
    ({"engine": {"name": "single"}, "lm": {"enabled": True, "interleave": True}}, r"lm\.interleave: .*'flow'"),
    ({"lm": {"enabled": True, "sync_every": 3}}, r"lm\.sync_every: only used with lm\.sync: every"),
    ({"lm": {"enabled": True, "grouping": "pagerank"}}, r"lm\.grouping: must be one of"),
    ({"data": {"path": "x", "feature_layout": "sparse"}, "lm": {"enabled": True}}, r"data\.feature_layout"),
])
def test_lm_section_errors_name_the_field(raw, match):
    raw = {"data": {"path": "x"}, **raw}
    with pytest.raises(ConfigError, match=match):
        config_from_dict(raw)


def test_gt_positional_encodings_are_checked_against_the_file(tmp_path):
    """model.pe_dim > 0 on a dataset file without enough /node/lap_pe columns: refused before training,
    naming the field, the file and the command that adds them."""
    import numpy as np

    from data_io.dataset import GraphData, write_dataset
    from data_io.preprocess import add_node_field

    rng = np.random.default_rng(0)
    n = 20
    indices = rng.integers(0, n, 3 * n)
    path = tmp_path / "g.h5"
    write_dataset(path, GraphData(indptr=np.arange(0, 3 * n + 1, 3, dtype=np.int64), indices=indices,
                                  feat=rng.random((n, 4), dtype=np.float32), label=rng.integers(0, 2, n)))

    def cfg(pe_dim):
        return load_config(_write(tmp_path, {"data": {"path": str(path)}, "engine": {"name": "single"},
                                             "model": {"name": "gt", "pe_dim": pe_dim}}))

    for pe_dim in (1, 8):
        with pytest.raises(ConfigError,
                           match=r"model\.pe_dim: .*/node/lap_pe of .*g\.h5 is missing.*preprocess lap-pe"):
            cfg(pe_dim)
    cfg(0)  # no encodings: nothing to check
    add_node_field(path, "lap_pe", rng.random((n, 3), dtype=np.float32))
    cfg(3)
    with pytest.raises(ConfigError, match=r"model\.pe_dim: 4 .* has 3 column"):
        cfg(4)


@pytest.mark.parametrize("model, message", [
    ({"attention": "dense_layers"}, r"model\.dense_layers: attention 'dense_layers' needs .* among 0\.\.2 .* got \[\]"),
    ({"attention": "dense_layers", "dense_layers": [0, 3]}, r"model\.dense_layers: .* got \[0, 3\]"),
    ({"attention": "sparse", "dense_layers": [1]},
     r"model\.dense_layers: only used with model\.attention: dense_layers"),
])
def test_dense_layers_are_checked_against_the_model(tmp_path, model, message):
    raw = {"data": {"path": "g.h5"}, "engine": {"name": "single"}, "model": {"name": "gt", "num_layers": 3, **model}}
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, raw))
    raw["model"].update(attention="dense_layers", dense_layers=[0, 2])
    assert list(load_config(_write(tmp_path, raw)).model.dense_layers) == [0, 2]  # accepted


def test_auto_admits_the_fields_of_the_engines_it_may_pick_and_checks_them_once_resolved(tmp_path):
    """engine.name: auto (the default) with a field only single/seqpar use: accepted until auto resolves; then
    refused where it resolved to an engine that does not use it (dp for a GCN on several ranks)."""
    from hpc_graph.train.config import check_resolved_engine

    cfg = load_config(_write(tmp_path, {"data": {"path": "g.h5"}, "engine": {"sequence_order": "rcm"},
                                        "model": {"name": "gt"}}))
    assert cfg.engine.name == "auto"
    for name in ("single", "seqpar"):
        check_resolved_engine(cfg, name)
    with pytest.raises(ConfigError, match=r"engine\.sequence_order: only used by engine .* but engine\.name is "
                                          r"'dp' \('auto' resolved\)"):
        check_resolved_engine(cfg, "dp")
    with pytest.raises(ConfigError, match=r"sampler\.fanouts: only used by engine"):  # no pick of auto uses it
        load_config(_write(tmp_path, {"data": {"path": "g.h5"}, "sampler": {"fanouts": [3, 3]}}))


def test_gt_encodings_check_leaves_an_unreadable_file_to_the_loader(tmp_path):
    path = tmp_path / "g.h5"
    path.write_bytes(b"not hdf5")
    cfg = load_config(_write(tmp_path, {"data": {"path": str(path)}, "engine": {"name": "single"},
                                        "model": {"name": "gt", "pe_dim": 8}}))
    assert cfg.model.pe_dim == 8  # no claim about /node/lap_pe of a file that is not HDF5


@pytest.mark.parametrize("inside", [False, True], ids=["is-a-file", "inside-a-file"])
def test_a_run_dir_that_cannot_be_a_directory_is_refused_before_loading(tmp_path, inside):
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder")
    run_dir = blocker / "a" / "b" if inside else blocker
    config = config_from_dict({"data": {"path": str(tmp_path)}, "train": {"run_dir": str(run_dir)}})
    with pytest.raises(ConfigError, match=f"^train.run_dir: {run_dir} (is inside {blocker}, which )?is a file, "
                                          "not a directory$"):
        check_paths(config)
    check_paths(config_from_dict({"data": {"path": str(tmp_path)}, "train": {"run_dir": str(tmp_path / "new" / "x")}}))
