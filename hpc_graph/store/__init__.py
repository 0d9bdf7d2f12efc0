"""Node data by global id for sampled training: the feature store and the historical embedding cache.

* :class:`~hpc_graph.store.feature_store.FeatureStore`: owned rows, a static
  cache of remote rows, and an ``alltoallv`` fetch of the rest.
* :class:`~hpc_graph.store.hec.HistoricalEmbeddingCache`: DistGNN-MB's cache
  of (stale) embeddings of remote nodes, one per inner layer.
"""
from hpc_graph.store.feature_store import FeatureStore
from hpc_graph.store.hec import HistoricalEmbeddingCache

__all__ = ["FeatureStore", "HistoricalEmbeddingCache"]
