"""PyTorch Geometric stores over spillfs: node features gathered through
:class:`spillfs.gnn.FeatureStore`, edges from CSR/CSC files.

    from spillfs.gnn import FeatureStore
    from spillfs.pyg import SpillFeatureStore, SpillGraphStore
    fs = SpillFeatureStore()
    fs.register("x", FeatureStore("/mnt/spill/feat.npy", device="cuda", gpu_cache_bytes=4 << 30))
    fs.put_tensor(labels, group_name=None, attr_name="y", index=None)   # small tensors in memory
    gs = SpillGraphStore.from_files("/mnt/spill/indptr.npy", "/mnt/spill/indices.npy", layout="csr")
    loader = NeighborLoader((fs, gs), num_neighbors=[15, 10, 5], batch_size=1024,
                            input_nodes=train_idx)

``NeighborLoader((feature_store, graph_store))`` calls
``feature_store.multi_get_tensor(attrs)`` once a batch: :meth:`_multi_get_tensor`
turns the batch's node index into one tensor once and gathers every attribute
from it (spillfs tables through their caches; in-memory tensors by indexing).
PyG materializes the whole CSC once when the sampler is made; the graph files
are read with ``np.load`` (memory-mapped), so any PyG-readable layout works.

PyG is only needed when this module is imported (ImportError otherwise).
"""

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, GraphStore, TensorAttr
from torch_geometric.data import FeatureStore as _PygFeatureStore

from .gnn import FeatureStore, ShardedFeatureStore

_TABLES = (FeatureStore, ShardedFeatureStore)

__all__ = ["SpillFeatureStore", "SpillGraphStore"]


class SpillFeatureStore(_PygFeatureStore):
    """A ``torch_geometric.data.FeatureStore`` whose attributes are spillfs
    feature tables (:meth:`register`) or in-memory tensors (``put_tensor``)."""

    def __init__(self):
        super().__init__()
        self._store = {}

    @staticmethod
    def _key(attr):
        return (attr.group_name, attr.attr_name)

    def register(self, attr_name, table, group_name=None):
        """Serves ``attr_name`` (of node type ``group_name``; None: a homogeneous
        graph) from ``table`` (a :class:`spillfs.gnn.FeatureStore`, or a
        :class:`spillfs.gnn.ShardedFeatureStore`: its gathers are collective, so
        every rank's loader must yield the same number of batches, e.g. each
        rank its share of the seeds, equal sizes, ``drop_last``)."""
        if not isinstance(table, _TABLES):
            raise TypeError(f"register() takes a spillfs.gnn.FeatureStore or ShardedFeatureStore, not "
                            f"{type(table).__name__}")
        self._store[(group_name, attr_name)] = table
        return self

    def _put_tensor(self, tensor, attr):
        if attr.index is not None and not (isinstance(attr.index, slice) and attr.index == slice(None)):
            raise ValueError("SpillFeatureStore keeps whole tensors: put them with index=None")
        self._store[self._key(attr)] = tensor
        return True

    def _get_tensor(self, attr):
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs):
        # One index tensor per distinct index object of the batch (NeighborLoader
        # gives every attribute the same one), converted once.
        index_cache = {}
        out = []
        for attr in attrs:
            held = self._store.get(self._key(attr))
            if held is None:
                out.append(None)
                continue
            index = attr.index
            whole = index is None or (isinstance(index, slice) and index == slice(None))
            if isinstance(held, _TABLES):
                if whole:
                    out.append(held.gather(slice(None)))
                    continue
                key = (id(index), held.device)
                idx = index_cache.get(key)
                if idx is None:
                    idx = index if isinstance(index, torch.Tensor) else torch.as_tensor(index)
                    idx = idx.to(held.device) if held.device.type == "cuda" else idx
                    index_cache[key] = idx
                out.append(held.gather(idx))
            else:
                if whole:
                    out.append(held)
                else:
                    idx = index if isinstance(index, torch.Tensor) else torch.as_tensor(index)
                    out.append(held[idx.to(held.device)])
        return out

    def _remove_tensor(self, attr):
        return self._store.pop(self._key(attr), None) is not None

    def _get_tensor_size(self, attr):
        held = self._store.get(self._key(attr))
        if held is None:
            return None
        return tuple(held.shape)

    def get_all_tensor_attrs(self):
        return [TensorAttr(group_name=g, attr_name=a) for (g, a) in self._store]

    def __len__(self):
        return len(self._store)


class SpillGraphStore(GraphStore):
    """A ``torch_geometric.data.GraphStore`` holding edge indices in memory, made
    from CSR or CSC files (:meth:`from_files`) or given tensors."""

    def __init__(self):
        super().__init__()
        self._store = {}

    @staticmethod
    def _key(attr):
        return (attr.edge_type, attr.layout.value, attr.is_sorted, attr.size)

    @classmethod
    def from_files(cls, indptr_path, indices_path, layout="csr", num_nodes=None, edge_type=None):
        """Edges from ``indptr`` and ``indices`` files (.npy, or raw int64): CSR
        (row u's neighbours are ``indices[indptr[u]:indptr[u+1]]``) or CSC."""
        if layout not in ("csr", "csc"):
            raise ValueError(f"layout must be 'csr' or 'csc', not {layout!r}")
        indptr = torch.from_numpy(np.array(_load_index(indptr_path), dtype=np.int64))
        indices = torch.from_numpy(np.array(_load_index(indices_path), dtype=np.int64))
        if len(indptr) < 1 or int(indptr[-1]) != len(indices):
            raise ValueError(f"{indptr_path}: indptr ends at {int(indptr[-1]) if len(indptr) else '?'}, but "
                             f"{indices_path} holds {len(indices)} indices")
        n = num_nodes if num_nodes is not None else len(indptr) - 1
        store = cls()
        edge_index = (indptr, indices) if layout == "csr" else (indices, indptr)
        store.put_edge_index(edge_index, edge_type=edge_type, layout=layout, size=(n, n))
        return store

    def _put_edge_index(self, edge_index, edge_attr):
        self._store[self._key(edge_attr)] = edge_index
        return True

    def _get_edge_index(self, edge_attr):
        return self._store.get(self._key(edge_attr), None)

    def _remove_edge_index(self, edge_attr):
        return self._store.pop(self._key(edge_attr), None) is not None

    def get_all_edge_attrs(self):
        return [EdgeAttr(*key) for key in self._store]


def _load_index(path):
    path = str(path)
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        a = np.load(path, mmap_mode="r")
        if a.ndim != 1:
            raise ValueError(f"{path}: an index file must be 1-D, not {a.shape}")
        return a
    return np.fromfile(path, dtype=np.int64)
