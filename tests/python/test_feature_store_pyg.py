"""spillfs.pyg: NeighborLoader over (SpillFeatureStore, SpillGraphStore) on
stock PyG (no pyg-lib, no torch-sparse), with spillfs.pyg.SpillNeighborSampler.

- The sampler's draws: every sampled edge is an edge of the graph (``e_id``
  names it), no edge twice for one node, min(degree, k) of them (k with
  replacement), the hop structure of pyg-lib's layout; over many draws each
  neighbour, and each k-subset, comes up equally often (chi-square bounds).
- Batches from the spillfs stores equal those from an in-memory Data for the
  same draws (x, y, edge_index, n_id, e_id, batch_size), and SAGEConv
  training over the loader learns (loss falls, gradients reach every weight).
- The store through PyG's FeatureStore API (multi_get_tensor) with batches of
  tools/bench/gnn_graph.py's sampler.

Every test runs on the CPU and, where there is a GPU, on CUDA (sampling, the
table and the model there); the CUDA cases skip without one, saying so, and
the module skips without PyG (Debian has none; the GPU machine has PyG 2.8)."""

import itertools
import os
import sys

import numpy as np
import pytest
import torch

pyg = pytest.importorskip("torch_geometric", reason="no PyG (torch_geometric) here")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools", "bench"))

from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402
from torch_geometric.nn import SAGEConv  # noqa: E402
from torch_geometric.sampler import NodeSamplerInput  # noqa: E402

import gnn_graph  # noqa: E402
from spillfs.gnn import FeatureStore  # noqa: E402
from spillfs.pyg import SpillFeatureStore, SpillGraphStore, SpillNeighborSampler, neighbor_loader  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


def make_graph(d, scale=10, width=32):
    n = 1 << scale
    src, dst = gnn_graph.rmat_edges(scale, 8 * n, seed=3, device="cpu")
    # Sorted by (col, row): every CSC conversion gives this order.
    order = np.lexsort((src.numpy(), dst.numpy()))
    row, col = src[order], dst[order]
    colptr = torch.zeros(n + 1, dtype=torch.int64)
    colptr[1:] = torch.cumsum(torch.bincount(col, minlength=n), 0)
    np.save(os.path.join(d, "colptr.npy"), colptr.numpy())
    np.save(os.path.join(d, "row.npy"), row.numpy())
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(5))
    np.save(os.path.join(d, "feat.npy"), x.numpy())
    y = torch.randint(0, 7, (n,), generator=torch.Generator().manual_seed(6))
    return n, torch.stack([row, col]), x, y


class Sage(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c1 = SAGEConv(width, 64)
        self.c2 = SAGEConv(64, 7)

    def forward(self, x, edge_index):
        return self.c2(torch.relu(self.c1(x, edge_index)), edge_index)


def train(loader, device, steps=8):
    torch.manual_seed(11)
    model = Sage(32).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, sizes = [], []
    torch.manual_seed(12)  # the sampler's draws
    for batch in itertools.islice(loader, steps):  # no batch beyond them drawn (their rows counted)
        batch = batch.to(device)
        opt.zero_grad()
        out = model(batch.x.float(), batch.edge_index)[:batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        sizes.append(batch.num_nodes)
    return losses, sizes


def simple_graph(n=240, max_degree=30, seed=0):
    """A graph without loops or parallel edges, node v with v % (max_degree + 1)
    in-neighbours, its edges in random order (so PyG's CSC permutes them);
    the Data and each node's in-neighbours."""
    rng = np.random.default_rng(seed)
    neighbours = [rng.choice(np.delete(np.arange(n), v), size=v % (max_degree + 1), replace=False)
                  for v in range(n)]
    row = np.concatenate(neighbours)
    col = np.repeat(np.arange(n), [len(a) for a in neighbours])
    order = rng.permutation(len(row))
    edge_index = torch.from_numpy(np.stack([row[order], col[order]])).long()
    return Data(edge_index=edge_index, num_nodes=n), neighbours


def sample(sampler, seeds):
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds))
    node, row, col, edge = (t.cpu() for t in (out.node, out.row, out.col, out.edge))
    perm = sampler.edge_permutation
    e_id = perm.cpu()[edge] if perm is not None else edge
    return out, node, row, col, e_id


def generator(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def chi_square_bound(df, z=4.75):
    """The chi-square statistic that df degrees of freedom exceed with
    probability about 1e-6 (z = 4.75 standard deviations), by Wilson and
    Hilferty's cube-root normal approximation (no scipy here)."""
    c = 2.0 / (9 * df)
    return df * (1 - c + z * c ** 0.5) ** 3


def chi_square(counts, expected):
    counts = np.asarray(counts, dtype=np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("replace", [False, True], ids=["without_replacement", "with_replacement"])
@pytest.mark.parametrize("fanout", [5, -1])
def test_draws_are_edges_of_the_graph_min_degree_k_each(device, replace, fanout):
    data, neighbours = simple_graph()
    n = data.num_nodes
    sampler = SpillNeighborSampler(data, [fanout], device=device, replace=replace, generator=generator(device, 1))
    seeds = torch.arange(n)
    out, node, row, col, e_id = sample(sampler, seeds)
    assert out.node.device.type == torch.device(device).type
    assert torch.equal(node[:n], seeds)  # seeds first, in order
    assert len(torch.unique(node)) == len(node)
    assert out.num_sampled_nodes == [n, len(node) - n] and out.num_sampled_edges == [len(row)]
    # Each (row, col) is the edge e_id of the graph, in the loader's orientation.
    assert torch.equal(torch.stack([node[row], node[col]]), data.edge_index[:, e_id])
    for v in range(n):
        mine = e_id[col == v]
        degree = len(neighbours[v])
        if fanout < 0:
            want = degree
        else:
            want = (fanout if degree else 0) if replace else min(degree, fanout)
        assert len(mine) == want, f"node {v}: {len(mine)} neighbours drawn, want {want} (degree {degree})"
        if not replace:
            assert len(torch.unique(mine)) == len(mine), f"node {v}: an edge drawn twice"


@pytest.mark.parametrize("device", DEVICES)
def test_hops_follow_pyg_lib_layout(device):
    data, neighbours = simple_graph()
    fanouts = [4, 3]
    sampler = SpillNeighborSampler(data, fanouts, device=device, generator=generator(device, 2))
    seeds = torch.arange(3, 240, 15)  # 16 seeds, degrees 3..30 and 0
    out, node, row, col, e_id = sample(sampler, seeds)
    assert torch.equal(node[:len(seeds)], seeds)
    assert len(torch.unique(node)) == len(node)
    assert sum(out.num_sampled_nodes) == len(node) and sum(out.num_sampled_edges) == len(row)
    assert len(out.num_sampled_nodes) == len(fanouts) + 1 and len(out.num_sampled_edges) == len(fanouts)
    assert torch.equal(torch.stack([node[row], node[col]]), data.edge_index[:, e_id])
    # Hop h draws for the nodes hop h - 1 added (the seeds for hop 1), and its
    # new nodes are the neighbours drawn that no earlier hop holds.
    node_end = np.cumsum(out.num_sampled_nodes)
    edge_end = np.cumsum([0] + out.num_sampled_edges)
    for hop, fanout in enumerate(fanouts):
        hop_col = col[edge_end[hop]:edge_end[hop + 1]]
        hop_row = row[edge_end[hop]:edge_end[hop + 1]]
        first, last = (node_end[hop - 1] if hop else 0), node_end[hop]
        assert ((hop_col >= first) & (hop_col < last)).all(), f"hop {hop + 1} drew for a node of another hop"
        targets = torch.arange(first, last)
        counts = torch.bincount(hop_col - first, minlength=len(targets))
        degrees = torch.tensor([len(neighbours[int(v)]) for v in node[targets]])
        assert torch.equal(counts, degrees.clamp(max=fanout)), f"hop {hop + 1}"
        new = torch.arange(last, node_end[hop + 1])
        assert set(new.tolist()) == set(hop_row[hop_row >= last].tolist())
        assert hop_row.max() < node_end[hop + 1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("replace", [False, True], ids=["without_replacement", "with_replacement"])
def test_every_neighbour_equally_likely(device, replace):
    # One seed repeated: each copy draws anew. Node 12 has 12 neighbours,
    # node 30 has 30; k = 5 of them, 4000 times.
    data, neighbours = simple_graph()
    k, draws = 5, 4000
    sampler = SpillNeighborSampler(data, [k], device=device, replace=replace, generator=generator(device, 3))
    for v in (12, 30):
        out, node, row, col, e_id = sample(sampler, torch.full((draws,), v))
        drawn = node[row].numpy()
        assert np.isin(drawn, neighbours[v]).all()
        counts = np.array([(drawn == u).sum() for u in neighbours[v]])
        assert counts.sum() == draws * k
        # Without replacement the counts vary less than a multinomial's (each
        # draw takes k distinct), so the multinomial's bound is a safe one.
        stat = chi_square(counts, draws * k / len(counts))
        assert stat < chi_square_bound(len(counts) - 1), f"node {v}: chi-square {stat:.1f}, counts {counts}"


@pytest.mark.parametrize("device", DEVICES)
def test_every_k_subset_equally_likely(device):
    # Uniform per neighbour is not enough (a sampler could favour some pairs):
    # node 6's 6 neighbours, k = 3: each of the 20 subsets about 4000 / 20 times.
    data, neighbours = simple_graph()
    draws = 4000
    sampler = SpillNeighborSampler(data, [3], device=device, generator=generator(device, 4))
    out, node, row, col, e_id = sample(sampler, torch.full((draws,), 6))
    by_seed = node[row].reshape(draws, 3)  # each seed copy's 3 edges are consecutive
    assert torch.equal(col.reshape(draws, 3), torch.arange(draws)[:, None].expand(-1, 3))
    subsets, counts = np.unique(np.sort(by_seed.numpy(), axis=1), axis=0, return_counts=True)
    assert len(subsets) == 20 and (np.diff(subsets, axis=1) > 0).all()
    stat = chi_square(counts, draws / 20)
    assert stat < chi_square_bound(19), f"chi-square {stat:.1f}, counts {counts}"


def test_sampler_refuses_what_it_does_not_sample():
    data, _ = simple_graph()
    with pytest.raises(NotImplementedError, match="induced"):
        SpillNeighborSampler(data, [5], subgraph_type="induced")
    hetero = HeteroData()
    hetero["a"].num_nodes = 3
    hetero["a", "to", "a"].edge_index = torch.tensor([[0, 1], [1, 2]])
    hetero["a", "from", "a"].edge_index = torch.tensor([[1, 2], [0, 1]])
    with pytest.raises(NotImplementedError, match="homogeneous"):
        SpillNeighborSampler(hetero, [5])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="generator"):
            SpillNeighborSampler(data, [5], device="cuda", generator=torch.Generator())


def spill_stores(d, y, device, layout="csc"):
    """(SpillFeatureStore, SpillGraphStore) over make_graph's files: x from the
    table (on ``device``), y in memory."""
    table = FeatureStore(os.path.join(d, "feat.npy"), device=device, host_bytes=64 * 4096,
                         gpu_cache_bytes=32 * 4096, window=0)
    fs = SpillFeatureStore().register("x", table)
    fs.put_tensor(y, group_name=None, attr_name="y", index=None)
    if layout == "csc":
        gs = SpillGraphStore.from_files(os.path.join(d, "colptr.npy"), os.path.join(d, "row.npy"), layout="csc")
    else:
        gs = SpillGraphStore.from_files(os.path.join(d, "rowptr.npy"), os.path.join(d, "col.npy"), layout="csr")
    return fs, gs, table


@pytest.mark.parametrize("device", DEVICES)
def test_spill_batches_equal_in_memory_for_the_same_draws(tmp_path, device):
    d = str(tmp_path)
    n, edge_index, x, y = make_graph(d)
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=n)
    fs, gs, table = spill_stores(d, y, device)
    # 1000 seeds in batches of 64: the last batch is short.
    seeds = torch.randperm(n, generator=torch.Generator().manual_seed(8))[:1000]
    args = dict(batch_size=64, input_nodes=seeds, shuffle=False)
    # is_sorted: the edges are sorted by column already, as in the files. PyG
    # would sort them again, and its sort (without pyg-lib) is not stable: it
    # would reorder each node's neighbours, and the same draws would pick
    # other ones.
    want = list(neighbor_loader(data, [5, 3], device=device, generator=generator(device, 9), is_sorted=True,
                                **args))
    got = list(neighbor_loader((fs, gs), [5, 3], device=device, generator=generator(device, 9), **args))
    assert len(got) == len(want) == 16
    for step, (g, w) in enumerate(zip(got, want)):
        assert g.batch_size == w.batch_size == min(64, 1000 - 64 * step)
        assert g.x.device.type == g.n_id.device.type == torch.device(device).type
        for key in ("n_id", "e_id", "edge_index", "x", "y", "input_id"):
            assert torch.equal(g[key].cpu(), w[key].cpu()), f"batch {step}: {key} differs"
        assert g.num_sampled_nodes == w.num_sampled_nodes and g.num_sampled_edges == w.num_sampled_edges
        assert torch.equal(g.n_id[:g.batch_size].cpu(), seeds[64 * step:64 * step + g.batch_size])
        np.testing.assert_array_equal(g.x.cpu().numpy(), x[g.n_id.cpu()].numpy())
        assert torch.equal(g.n_id[g.edge_index].cpu(), edge_index[:, g.e_id.cpu()])
    # Draws were made: hop 1 took fewer edges than the seeds have.
    degree = torch.bincount(edge_index[1], minlength=n)
    assert all(w.num_sampled_edges[0] < degree[w.n_id[:w.batch_size].cpu()].sum() for w in want)
    s = table.stats()
    assert s["requests"] == sum(g.num_nodes for g in got)
    # Another seed, other draws: the batches depend on the generator.
    other = next(iter(neighbor_loader((fs, gs), [5, 3], device=device, generator=generator(device, 10), **args)))
    assert not torch.equal(other.n_id.cpu(), got[0].n_id.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_over_csr_files(tmp_path, device):
    # The module's example keeps the graph as CSR: PyG turns it into a CSC
    # with a permutation, which e_id must undo.
    d = str(tmp_path)
    n, edge_index, x, y = make_graph(d)
    order = np.lexsort((edge_index[1].numpy(), edge_index[0].numpy()))
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(edge_index[0], minlength=n), 0)
    np.save(os.path.join(d, "rowptr.npy"), rowptr.numpy())
    np.save(os.path.join(d, "col.npy"), edge_index[1].numpy()[order])
    csr_edges = edge_index[:, torch.from_numpy(order)]  # CSR position -> edge
    fs, gs, _ = spill_stores(d, y, device, layout="csr")
    loader = neighbor_loader((fs, gs), [4, 4], device=device, generator=generator(device, 11), batch_size=128,
                             input_nodes=torch.arange(n))
    for batch in loader:
        assert torch.equal(batch.n_id[batch.edge_index].cpu(), csr_edges[:, batch.e_id.cpu()])
        np.testing.assert_array_equal(batch.x.cpu().numpy(), x[batch.n_id.cpu()].numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_sage_training_over_spillfs_learns(tmp_path, device):
    d = str(tmp_path)
    n, edge_index, x, _ = make_graph(d)
    y = x[:, :7].argmax(dim=1)  # learnable from a node's own features (SAGEConv's root weight)
    fs, gs, _ = spill_stores(d, y, device)
    loader = neighbor_loader((fs, gs), [10, 5], device=device, generator=generator(device, 12), batch_size=128,
                             input_nodes=torch.arange(n), shuffle=True)
    torch.manual_seed(13)
    model = Sage(32).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(3):  # 8 batches an epoch
        for batch in loader:
            batch = batch.to(device)
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = torch.nn.functional.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            for name, p in model.named_parameters():
                assert p.grad is not None and torch.isfinite(p.grad).all(), name
                assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 24 and np.isfinite(losses).all()
    # Chance is ln 7 = 1.95; the first epoch's mean must fall by a quarter by the third.
    first, last = np.mean(losses[:8]), np.mean(losses[-8:])
    assert last < 0.75 * first, losses


@pytest.mark.parametrize("device", DEVICES)
def test_neighbor_loader_sage_same_loss_as_in_memory(tmp_path, device):
    d = str(tmp_path)
    n, edge_index, x, y = make_graph(d)
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=n)
    # All neighbours: the batches do not depend on the sampler's random numbers.
    ref = neighbor_loader(data, [-1, -1], device=device, batch_size=64, input_nodes=torch.arange(n), shuffle=False)
    want, want_sizes = train(ref, device)

    table = FeatureStore(os.path.join(d, "feat.npy"), device=device, host_bytes=64 * 4096,
                         gpu_cache_bytes=32 * 4096, window=0)
    fs = SpillFeatureStore().register("x", table)
    fs.put_tensor(y, group_name=None, attr_name="y", index=None)
    gs = SpillGraphStore.from_files(os.path.join(d, "colptr.npy"), os.path.join(d, "row.npy"), layout="csc")
    calls = []
    original = fs._multi_get_tensor

    def counted(attrs):
        calls.append(sorted(a.attr_name for a in attrs))
        return original(attrs)

    fs._multi_get_tensor = counted
    loader = neighbor_loader((fs, gs), [-1, -1], device=device, batch_size=64, input_nodes=torch.arange(n),
                             shuffle=False)
    got, got_sizes = train(loader, device)
    assert got_sizes == want_sizes
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert calls and all(c == ["x", "y"] for c in calls)  # one call a batch, both attributes
    s = table.stats()
    assert s["requests"] == sum(got_sizes)
    assert s["requests"] == s["gpu_hits"] + s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
    # Sampled neighbourhoods: every batch's features are the rows of its nodes.
    sampled = neighbor_loader((fs, gs), [5, 5], device=device, batch_size=64, input_nodes=torch.arange(n),
                              shuffle=True)
    for step, batch in enumerate(sampled):
        if step == 5:
            break
        assert batch.x.device.type == batch.n_id.device.type == torch.device(device).type
        np.testing.assert_array_equal(batch.x.cpu().numpy(), x[batch.n_id.cpu()].numpy())
    losses, _ = train(sampled, device, steps=4)
    assert all(np.isfinite(losses))


@pytest.mark.parametrize("device", DEVICES)
def test_sage_steps_through_the_store_same_loss_as_in_memory(tmp_path, device):
    from torch_geometric.data.feature_store import TensorAttr

    d = str(tmp_path)
    n, edge_index, x, y = make_graph(d)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(edge_index[1], minlength=n), 0)
    indices = edge_index[0]  # sorted by column: in-neighbours of each node
    table = FeatureStore(os.path.join(d, "feat.npy"), device=device, host_bytes=64 * 4096,
                         gpu_cache_bytes=32 * 4096, window=0)
    fs = SpillFeatureStore().register("x", table)
    fs.put_tensor(y, group_name=None, attr_name="y", index=None)

    def steps(features, labels, count=6):
        torch.manual_seed(11)
        model = Sage(32).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(13)
        losses = []
        for step in range(count):
            seeds = torch.arange(step * 64, (step + 1) * 64)
            nodes, ei, seed_local = gnn_graph.sample(indptr, indices, seeds, [5, 5], generator=gen)
            xb, yb = features(nodes), labels(nodes)
            assert xb.device.type == torch.device(device).type
            opt.zero_grad()
            out = model(xb.float(), ei.to(device))[seed_local.to(device)]
            loss = torch.nn.functional.cross_entropy(out, yb.to(device)[seed_local.to(device)])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    want = steps(lambda nodes: x[nodes].to(device), lambda nodes: y[nodes])
    calls = []

    def from_store(nodes):
        got = fs.multi_get_tensor([TensorAttr(None, "x", nodes), TensorAttr(None, "y", nodes)])
        calls.append(len(got))
        np.testing.assert_array_equal(got[0].cpu().numpy(), x[nodes].numpy())
        return got[0]

    got = steps(from_store, lambda nodes: y[nodes])
    assert calls == [2] * len(want)  # one batched call a batch, both attributes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    s = table.stats()
    assert s["requests"] == s["gpu_hits"] + s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]


def test_graph_store_from_csr_files(tmp_path):
    d = str(tmp_path)
    indptr = np.array([0, 2, 3, 3])
    indices = np.array([1, 2, 0])
    np.save(os.path.join(d, "indptr.npy"), indptr)
    indices.astype(np.int64).tofile(os.path.join(d, "indices.bin"))
    gs = SpillGraphStore.from_files(os.path.join(d, "indptr.npy"), os.path.join(d, "indices.bin"))
    (attr,) = gs.get_all_edge_attrs()
    assert attr.size == (3, 3)
    with pytest.raises(ValueError, match="indptr"):
        np.save(os.path.join(d, "bad.npy"), np.array([0, 5]))
        SpillGraphStore.from_files(os.path.join(d, "bad.npy"), os.path.join(d, "indices.bin"))
