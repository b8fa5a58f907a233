"""spillfs.pyg: a real NeighborLoader over (SpillFeatureStore, SpillGraphStore)
drives SAGEConv training steps on a small generated power-law graph with the
same batches and the same loss as over an in-memory Data object; the store's
_multi_get_tensor serves every attribute in one call per batch. Skips, saying
so, without PyG (Debian has none; the GPU machine has PyG 2.8), and the CUDA
case without a GPU.

NeighborLoader samples with pyg-lib or torch-sparse; where neither is
installed (the GPU machine has neither) its test skips saying so, and
test_sage_steps_through_the_store_same_loss_as_in_memory drives the same
store through PyG's FeatureStore API (multi_get_tensor, what the loader
calls once a batch) with batches sampled by tools/bench/gnn_graph.py."""

import os
import sys

import numpy as np
import pytest
import torch

pyg = pytest.importorskip("torch_geometric", reason="no PyG (torch_geometric) here")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools", "bench"))

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402
from torch_geometric.nn import SAGEConv  # noqa: E402

import gnn_graph  # noqa: E402
from spillfs.gnn import FeatureStore  # noqa: E402
from spillfs.pyg import SpillFeatureStore, SpillGraphStore  # noqa: E402

# What NeighborLoader's sampler needs (torch_geometric.typing says what is installed).
SAMPLER = getattr(pyg.typing, "WITH_PYG_LIB", False) or getattr(pyg.typing, "WITH_TORCH_SPARSE", False)
needs_sampler = pytest.mark.skipif(not SAMPLER, reason="NeighborLoader needs pyg-lib or torch-sparse; neither is "
                                   "installed here (the store is driven without them in "
                                   "test_sage_steps_through_the_store_same_loss_as_in_memory)")

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
    for step, batch in enumerate(loader):
        if step == steps:
            break
        batch = batch.to(device)
        opt.zero_grad()
        out = model(batch.x.float(), batch.edge_index)[:batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        sizes.append(batch.num_nodes)
    return losses, sizes


@needs_sampler
@pytest.mark.parametrize("device", DEVICES)
def test_neighbor_loader_sage_same_loss_as_in_memory(tmp_path, device):
    d = str(tmp_path)
    n, edge_index, x, y = make_graph(d)
    data = Data(x=x, edge_index=edge_index, y=y, num_nodes=n)
    # All neighbours: the batches do not depend on the sampler's random numbers.
    ref = NeighborLoader(data, num_neighbors=[-1, -1], batch_size=64, input_nodes=torch.arange(n), shuffle=False)
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
    loader = NeighborLoader((fs, gs), num_neighbors=[-1, -1], batch_size=64, input_nodes=torch.arange(n),
                            shuffle=False)
    got, got_sizes = train(loader, device)
    assert got_sizes == want_sizes
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert calls and all(c == ["x", "y"] for c in calls)  # one call a batch, both attributes
    s = table.stats()
    assert s["requests"] == sum(got_sizes)
    assert s["requests"] == s["gpu_hits"] + s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
    # Sampled neighbourhoods: every batch's features are the rows of its nodes.
    sampled = NeighborLoader((fs, gs), num_neighbors=[5, 5], batch_size=64, input_nodes=torch.arange(n),
                             shuffle=True)
    for step, batch in enumerate(sampled):
        if step == 5:
            break
        assert batch.x.device.type == torch.device(device).type
        if hasattr(batch, "n_id"):
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
