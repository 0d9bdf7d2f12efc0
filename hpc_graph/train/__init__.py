"""hpc_graph.train: configuration, the Trainer loop and per-rank metrics.

``load_config``/``Config`` (:mod:`~hpc_graph.train.config`), ``Trainer``
(:mod:`~hpc_graph.train.trainer`), ``MetricsWriter``/``read_metrics``/``peak_rss_mb``
(:mod:`~hpc_graph.train.metrics`).
"""
from hpc_graph.train.config import (Config, ConfigError, DataConfig, ModelConfig, OptimConfig, TrainConfig,
                                    config_from_dict, config_to_dict, load_config)
from hpc_graph.train.metrics import MetricsWriter, metrics_path, peak_rss_mb, read_metrics

__all__ = ["Config", "ConfigError", "DataConfig", "EngineConfig", "ModelConfig", "OptimConfig", "TrainConfig",
           "config_from_dict", "config_to_dict", "load_config", "MetricsWriter", "metrics_path", "peak_rss_mb",
           "read_metrics", "Trainer"]


def __getattr__(name):  # Trainer pulls in engines and ops, EngineConfig the engines' options: on first use
    if name == "Trainer":
        from hpc_graph.train.trainer import Trainer
        return Trainer
    if name == "EngineConfig":
        from hpc_graph.train.config import engine_section_classes
        return engine_section_classes()["engine"]
    raise AttributeError(name)
