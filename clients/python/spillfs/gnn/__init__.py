"""GNN feature tables served from storage: :class:`FeatureStore`.

    from spillfs.gnn import FeatureStore, reverse_pagerank
    score = reverse_pagerank(indptr, indices)              # 20 iterations, damping 0.85
    feats = FeatureStore("/mnt/spill/feat.npy", device="cuda", gpu_cache_bytes=4 << 30,
                         host_bytes=8 << 30, hot=1_000_000, score=score, window=4)
    feats.prefetch(next_batch_nodes)                       # batches already sampled
    x = feats.gather(batch_nodes)                          # (len, width) on the device
    x = feats[batch_nodes]                                 # the same, tensor-like
    print(feats.stats())                                   # hits per tier, SSD reads...

The table is an ordinary file: a 2-D C-order ``.npy`` (header parsed) or a raw
row-major file (``shape=``, ``dtype=``), on a spillfs mount (the direct path,
block checksums verified) or any other file system (io_uring ``O_DIRECT``).
``np.load(path, mmap_mode="r")`` keeps working on it.

Tiers, searched in order for each row of a batch:

- ``device="cuda"``: the GPU software cache (lines in HBM, looked up by a
  gather kernel, up to 32 rows a warp), the hot-node buffer (pinned host memory
  the kernel reads over PCIe), the victim buffer, then storage: the kernel
  posts what is left to a request ring the host turns into batched row reads
  (``spill_file_read_rows``) into pinned staging. ``gpu_cache_bytes`` bounds
  HBM; ``host_bytes`` the pinned hot and victim buffers.
- ``device="cpu"``: a host cache of lines within ``host_bytes`` (its hot part
  holding the hot rows, never evicted; a victim part when ``window`` > 0),
  then storage.

Hot rows (``hot``): a count (the top rows by ``score``: an array of one score
per row, ``"degree"`` or ``"pagerank"`` with ``graph=(indptr, indices)``), or
the row ids themselves. Eviction (``policy``): ``"hybrid"`` (static score plus
next reuse from the ``window`` batches given to :meth:`prefetch`), ``"lru"``
or ``"static"``: see :mod:`spillfs.gnn._store.line_cache`.

Errors: an index out of range raises ``IndexError`` naming it; a float index
``IndexError`` (as torch); a malformed file ``ValueError`` naming the file.
Threading: a FeatureStore may be shared by threads; its calls run one at a time.

Several GPUs or hosts: :class:`ShardedFeatureStore` (one process per GPU under
``torch.distributed``; each rank caches the lines it owns, a gather asks the
owners in one batched exchange): see :mod:`spillfs.gnn._store.sharded`.
"""

# The stores live in the private package _store (one module a concern: the
# single-process store, the sharded one, the GPU tiers, the line-cache
# policies, the table reader); this module is their public face.
from ._store.feature_store import FeatureStore, degree_score, reverse_pagerank
from ._store.sharded import PeerError, ShardedFeatureStore, write_shards

__all__ = ["FeatureStore", "ShardedFeatureStore", "PeerError", "write_shards", "degree_score", "reverse_pagerank"]
