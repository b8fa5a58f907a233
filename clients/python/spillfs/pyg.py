"""PyTorch Geometric stores over spillfs: node features gathered through
:class:`spillfs.gnn.FeatureStore`, edges from CSR/CSC files.

    from spillfs.gnn import FeatureStore
    from spillfs.pyg import SpillFeatureStore, SpillGraphStore, neighbor_loader
    fs = SpillFeatureStore()
    fs.register("x", FeatureStore("/mnt/spill/feat.npy", device="cuda", gpu_cache_bytes=4 << 30))
    fs.put_tensor(labels, group_name=None, attr_name="y", index=None)   # small tensors in memory
    gs = SpillGraphStore.from_files("/mnt/spill/indptr.npy", "/mnt/spill/indices.npy", layout="csr")
    loader = neighbor_loader((fs, gs), num_neighbors=[15, 10, 5], batch_size=1024,
                             input_nodes=train_idx, shuffle=True, device="cuda")
    for batch in loader:            # batch.x, batch.n_id, batch.edge_index on the GPU
        batch = batch.to("cuda")    # y and the like, held in memory on the CPU
        out = model(batch.x, batch.edge_index)[:batch.batch_size]

``NeighborLoader((feature_store, graph_store))`` calls
``feature_store.multi_get_tensor(attrs)`` once a batch: :meth:`_multi_get_tensor`
turns the batch's node index into one tensor once and gathers every attribute
from it (spillfs tables through their caches; in-memory tensors by indexing).
PyG materializes the whole CSC once when the sampler is made (then held on the
sampler's ``device``); the graph files are read with ``np.load``
(memory-mapped), so any PyG-readable layout works.

Sampling: PyG's own ``NeighborSampler`` (what a plain ``NeighborLoader``
makes) needs pyg-lib or torch-sparse, which stock PyG lacks;
:class:`SpillNeighborSampler` samples with plain torch ops, on the CPU or a
GPU (``device``). :func:`neighbor_loader` is a ``NeighborLoader`` with that
sampler: the loader's arguments, plus the sampler's (``device``,
``generator``, ``replace``). Equivalently, ``NeighborLoader((fs, gs),
num_neighbors=[15, 10, 5], ..., neighbor_sampler=SpillNeighborSampler((fs,
gs), [15, 10, 5], device="cuda"))`` (the loader then ignores its own
``num_neighbors``). Both work on an in-memory ``Data`` too.

PyG is only needed when this module is imported (ImportError otherwise).
"""

import warnings

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, GraphStore, TensorAttr
from torch_geometric.data import FeatureStore as _PygFeatureStore
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import NeighborSampler, SamplerOutput
from torch_geometric.sampler.base import SubgraphType

from .gnn import FeatureStore, ShardedFeatureStore

_TABLES = (FeatureStore, ShardedFeatureStore)

__all__ = ["SpillFeatureStore", "SpillGraphStore", "SpillNeighborSampler", "neighbor_loader"]


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



class SpillNeighborSampler(NeighborSampler):
    r"""Uniform neighbour sampling in plain torch ops, on the CPU or a GPU: a
    ``torch_geometric.sampler.NeighborSampler`` that needs neither pyg-lib nor
    torch-sparse, for :class:`~torch_geometric.loader.NeighborLoader` (or
    ``LinkNeighborLoader``) over ``(SpillFeatureStore, SpillGraphStore)`` or an
    in-memory :class:`~torch_geometric.data.Data`.

    Each hop draws, for every node the hop before added (the seeds first), up
    to ``num_neighbors[hop]`` of its in-neighbours (the rows of its CSC
    column): all of them where it has no more, else a uniformly random subset
    without replacement, as pyg-lib does by default (``replace=True``: that
    many independent uniform draws); ``-1`` takes all. The output has
    pyg-lib's layout: ``node`` holds the seeds first, then each hop's new
    nodes in the order they were first drawn; ``row`` (the neighbour) and
    ``col`` (the node it was drawn for) index ``node``; ``edge`` holds the
    edges' positions in the CSC (the loader maps them through
    :attr:`edge_permutation` to ``e_id``); ``num_sampled_nodes`` and
    ``num_sampled_edges`` count each hop's, as ``trim_to_layer`` wants.

    Args:
        data (Data or Tuple[FeatureStore, GraphStore]): a homogeneous graph.
        num_neighbors (List[int]): neighbours to draw per node at each hop.
        device (torch.device or str, optional): where the CSC is held and
            sampled, and where the returned indices live. (default: cpu)
        replace (bool, optional): draw with replacement. (default: False)
        generator (torch.Generator, optional): the random numbers, a
            generator on ``device``: the same seed gives the same batches.
            Loader workers (``num_workers > 0``) would each copy it and draw
            the same numbers: leave it None there. (default: the device's
            default generator)
        subgraph_type (SubgraphType or str, optional): ``"directional"`` or
            ``"bidirectional"``; ``"induced"`` is not implemented.
            (default: ``"directional"``)
        is_sorted (bool, optional): ``data``'s edges are sorted by
            destination already, as for PyG's sampler. (default: False)

    Each node's neighbours are in the order of PyG's CSC: a ``Data``'s edges
    sorted by destination with PyG's sort (not stable without pyg-lib) unless
    ``is_sorted``; a ``GraphStore``'s CSC as stored. Two copies of a graph
    give the same batches for the same draws only where those orders agree.

    Heterogeneous graphs are refused; temporal, weighted and disjoint
    sampling (PyG's, with pyg-lib) are not offered. Sampling on a GPU needs
    ``num_workers=0`` (CUDA does not survive the workers' fork).
    """

    def __init__(self, data, num_neighbors, device=None, replace=False, generator=None,
                 subgraph_type="directional", is_sorted=False):
        if SubgraphType(subgraph_type) == SubgraphType.induced:
            raise NotImplementedError("SpillNeighborSampler samples 'directional' or 'bidirectional' subgraphs, "
                                      "not 'induced' ones")
        self.device = torch.device(device if device is not None else "cpu")
        if generator is not None and generator.device.type != self.device.type:
            raise ValueError(f"the generator is on {generator.device}, the sampler samples on {self.device}")
        self.generator = generator
        with warnings.catch_warnings():
            # PyG's "without pyg-lib is deprecated" is about its own fallback
            # (torch-sparse), which this sampler does not use.
            warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation")
            super().__init__(data, num_neighbors, subgraph_type=subgraph_type, replace=replace,
                             is_sorted=is_sorted)
        if self.is_hetero:
            raise NotImplementedError("SpillNeighborSampler samples homogeneous graphs only (one edge type), not "
                                      f"{len(self.edge_types)} edge types")
        # PyG builds the CSC on the CPU; it moves to where sampling happens once.
        self.colptr = self.colptr.to(self.device, torch.int64)
        self.row = self.row.to(self.device, torch.int64)
        if self.perm is not None:
            self.perm = self.perm.to(self.device)

    def _sample(self, seed, seed_time=None, **kwargs):
        if isinstance(seed, dict):
            raise NotImplementedError("SpillNeighborSampler samples homogeneous graphs only")
        if seed_time is not None:
            raise NotImplementedError("SpillNeighborSampler does not sample by time (no time_attr)")
        nodes = seed.to(self.device, torch.int64)
        frontier = torch.arange(len(nodes), device=self.device)  # positions in nodes
        rows, cols, edges = [], [], []
        num_sampled_nodes, num_sampled_edges = [len(nodes)], []
        for fanout in self.num_neighbors.get_mapped_values():
            edge, owner = self._draw(nodes[frontier], fanout)
            held = len(nodes)
            nodes, neighbour = _append_new(nodes, self.row[edge])
            rows.append(neighbour)
            cols.append(frontier[owner])
            edges.append(edge)
            num_sampled_nodes.append(len(nodes) - held)
            num_sampled_edges.append(len(edge))
            frontier = torch.arange(held, len(nodes), device=self.device)
        empty = nodes[:0]
        return SamplerOutput(node=nodes, row=torch.cat(rows) if rows else empty,
                             col=torch.cat(cols) if cols else empty, edge=torch.cat(edges) if edges else empty,
                             batch=None, num_sampled_nodes=num_sampled_nodes, num_sampled_edges=num_sampled_edges)

    def _draw(self, targets, fanout):
        """The CSC positions of the neighbours drawn for ``targets`` (node ids),
        target by target, and the position in ``targets`` each was drawn for."""
        start = self.colptr[targets]
        degree = self.colptr[targets + 1] - start
        if fanout < 0:  # all neighbours, in CSC order
            owner = torch.repeat_interleave(degree)
            return start[owner] + _slots(degree, owner), owner
        if self.replace:
            count, drawn = torch.where(degree > 0, fanout, 0), degree > 0
        else:
            count, drawn = degree.clamp(max=fanout), degree > fanout
        owner = torch.repeat_interleave(count)
        slot = _slots(count, owner)
        # Targets with no more than `fanout` neighbours give all of them, in CSC
        # order; the others the offsets drawn for them.
        offset = slot.clone()
        picks = self._offsets(degree[drawn], fanout)
        rank = torch.cumsum(drawn, 0) - 1  # a drawn target's row in picks
        from_picks = drawn[owner]
        offset[from_picks] = picks[rank[owner[from_picks]], slot[from_picks]]
        return start[owner] + offset, owner

    def _offsets(self, degree, k):
        """``k`` offsets into each of ``len(degree)`` neighbour lists (a
        ``(len(degree), k)`` tensor, each row sorted): a uniform ``k``-subset of
        ``range(degree)`` (Floyd's algorithm: ``k`` vectorized steps, work
        independent of the degree, so hubs cost no more than leaves), or ``k``
        independent uniform draws with ``replace``."""
        # float64: exact enough for degrees up to 2**53 (float32's 24-bit
        # mantissa would favour some offsets of hubs).
        uniform = torch.rand((len(degree), k), dtype=torch.float64, device=self.device, generator=self.generator)
        if self.replace:
            return torch.minimum((uniform * degree[:, None]).long(), degree[:, None] - 1).sort(dim=1).values
        picks = torch.empty((len(degree), k), dtype=torch.int64, device=self.device)
        for i in range(k):
            # Step i draws from [0, top]; top itself is never taken before it.
            top = degree - k + i
            pick = torch.minimum((uniform[:, i] * (top + 1)).long(), top)
            if i:
                pick = torch.where((picks[:, :i] == pick[:, None]).any(dim=1), top, pick)
            picks[:, i] = pick
        return picks.sort(dim=1).values


def _slots(count, owner):
    """For ``owner = repeat_interleave(count)``: each entry's rank among its owner's."""
    return torch.arange(len(owner), device=owner.device) - (torch.cumsum(count, 0) - count)[owner]


def _append_new(nodes, candidates):
    """``nodes`` followed by the ``candidates`` it does not hold yet, in the
    order they first appear, and each candidate's position in the result.
    Sort-based (torch.unique), so memory grows with the batch, not the graph."""
    held = len(nodes)
    both = torch.cat([nodes, candidates])
    unique, inverse = torch.unique(both, return_inverse=True)
    first = torch.full((len(unique),), len(both), dtype=torch.int64, device=both.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(both), device=both.device), reduce="amin")
    new = torch.nonzero(first >= held).squeeze(1)
    new = new[torch.argsort(first[new])]
    position = first  # a held node's first position; the new ones follow
    position[new] = held + torch.arange(len(new), device=both.device)
    return torch.cat([nodes, unique[new]]), position[inverse[held:]]


def neighbor_loader(data, num_neighbors, device=None, replace=False, generator=None, subgraph_type="directional",
                    is_sorted=False, **kwargs):
    r"""A :class:`~torch_geometric.loader.NeighborLoader` over ``data`` that
    samples with :class:`SpillNeighborSampler` (no pyg-lib or torch-sparse
    needed).

    Args:
        data (Data or Tuple[FeatureStore, GraphStore]): a homogeneous graph,
            e.g. ``(SpillFeatureStore, SpillGraphStore)``.
        num_neighbors (List[int]): neighbours to draw per node at each hop.
        device, replace, generator, subgraph_type, is_sorted: as for
            :class:`SpillNeighborSampler`.
        **kwargs: the loader's other arguments (``input_nodes``,
            ``batch_size``, ``shuffle``, ``transform``, ...).
    """
    sampler = SpillNeighborSampler(data, num_neighbors, device=device, replace=replace, generator=generator,
                                   subgraph_type=subgraph_type, is_sorted=is_sorted)
    return NeighborLoader(data, num_neighbors, neighbor_sampler=sampler, **kwargs)

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
