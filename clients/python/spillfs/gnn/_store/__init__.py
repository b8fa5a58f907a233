"""The stores behind :mod:`spillfs.gnn`, one concern a module.

- :mod:`.sharded`: :class:`~.sharded.ShardedFeatureStore` (one cache over the
  processes of a ``torch.distributed`` group, a FeatureStore a rank),
  :func:`~.sharded.write_shards`.
- :mod:`.feature_store`: :class:`~.feature_store.FeatureStore` (one process)
  and its host tiers (``device="cpu"``), the hot-row scores.
- :mod:`.gpu_cache`: the tiers of ``device="cuda"`` (libspillfs_client's GPU
  feature cache).
- :mod:`.line_cache`: the line directory, window and victim buffer: the
  eviction policies both tiers share.
- :mod:`.table`: the table file (``.npy`` header or raw) and its row reads.
- :mod:`.index`: a user's index to rows, shared by the stores.

Imports go one way, down this list; nothing here imports :mod:`spillfs.gnn`
(tests/python/test_imports.py checks the package has no import circle).
"""
