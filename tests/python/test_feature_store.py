"""spillfs.gnn.FeatureStore: gathers equal numpy indexing of the same file (random,
Zipf and boundary indices, every dtype, row counts not a multiple of a line,
rows not a multiple of 4 KiB), on a plain directory and on a spillfs mount;
the eviction policies keep their invariants (capacity, victims only when the
window reuses them, hot rows never evicted); stats add up; out-of-range
indices and malformed files are refused. The same on CUDA where there is a
GPU (else those tests skip, saying so)."""

import os

import numpy as np
import pytest
import torch

from spillfs.gnn._store import line_cache as _line_cache
from spillfs.gnn._store.table import open_table
from spillfs.gnn import FeatureStore, degree_score, reverse_pagerank

HAVE_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device"))]


@pytest.fixture(params=["dir", "mount"])
def place(request, tmp_path):
    """A directory for tables: a plain one, or a spillfs mount (the direct path)."""
    if request.param == "dir":
        return str(tmp_path)
    mnt = request.getfixturevalue("mount")
    d = os.path.join(mnt, request.node.name.replace("[", "_").replace("]", "_"))
    os.makedirs(d, exist_ok=True)
    return d


def table(place, name, rows, width, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        a = rng.random((rows, width)) < 0.5
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=(rows, width), dtype=dtype, endpoint=True)
    elif np.issubdtype(dtype, np.complexfloating):
        a = (rng.standard_normal((rows, width)) + 1j * rng.standard_normal((rows, width))).astype(dtype)
    else:
        a = rng.standard_normal((rows, width)).astype(dtype)
    path = os.path.join(place, name)
    np.save(path, a)
    return path, a


def zipf(rows, n, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows)
    return perm[(rng.zipf(1.3, n) - 1) % rows]


def check_gathers(fs, a, device="cpu", seed=1):
    rows = len(a)
    rng = np.random.default_rng(seed)
    cases = [rng.integers(0, rows, 500), zipf(rows, 700, seed), np.array([0, rows - 1, -1, -rows, 0, rows - 1]),
             np.arange(rows), np.array([], dtype=np.int64)]
    for idx in cases:
        got = fs.gather(torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(device))
        assert got.device.type == torch.device(device).type
        assert got.shape == (len(idx), a.shape[1])
        np.testing.assert_array_equal(got.cpu().numpy(), a[idx])
    s = fs.stats()
    assert s["requests"] == sum(len(c) for c in cases)
    assert s["requests"] == s["gpu_hits"] + s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]


DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.bool_,
          np.complex64]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gather_equals_numpy_every_dtype(place, dtype, device):
    # 1237 rows: not a multiple of any line; 13 elements: rows of odd bytes.
    path, a = table(place, f"t_{np.dtype(dtype).name}.npy", 1237, 13, dtype)
    fs = FeatureStore(path, device=device, host_bytes=8 * 4096, gpu_cache_bytes=8 * 4096, window=2)
    check_gathers(fs, a, device)
    assert fs.dtype == torch.from_numpy(a[:1]).dtype
    fs.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [1, 1024, 1100, 3000])  # rows of 4 B, exactly 4 KiB, 4400 B, 12000 B
def test_gather_rows_around_a_block(place, width, device):
    path, a = table(place, f"w{width}.npy", 97, width, np.float32, seed=width)
    for policy in _line_cache.POLICIES:
        fs = FeatureStore(path, device=device, host_bytes=5 * 4 * width * 4, gpu_cache_bytes=3 * 4 * width * 4,
                          policy=policy, window=1)
        check_gathers(fs, a, device, seed=width)
        fs.close()


@pytest.mark.parametrize("device", DEVICES)
def test_index_dtypes_and_forms(place, device):
    path, a = table(place, "idx.npy", 200, 5, np.float32)
    fs = FeatureStore(path, device=device)
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        idx = torch.tensor([0, 5, 127, 3, 3], dtype=dt)
        np.testing.assert_array_equal(fs.gather(idx.to(device)).cpu().numpy(), a[idx.long().numpy()])
    for idx in ([1, 2, -1], np.array([7, 199], dtype=np.uint16), np.array([3], dtype=np.int32)):
        np.testing.assert_array_equal(fs.gather(idx).cpu().numpy(), a[np.asarray(idx).astype(np.int64)])
    np.testing.assert_array_equal(fs[5].cpu().numpy(), a[5])
    np.testing.assert_array_equal(fs[-2].cpu().numpy(), a[-2])
    np.testing.assert_array_equal(fs[10:20:3].cpu().numpy(), a[10:20:3])
    np.testing.assert_array_equal(fs[[4, 4], 1:3].cpu().numpy(), a[[4, 4], 1:3])
    mask = np.zeros(200, dtype=bool)
    mask[[3, 9]] = True
    np.testing.assert_array_equal(fs[torch.from_numpy(mask)].cpu().numpy(), a[mask])
    assert fs.shape == (200, 5) and len(fs) == 200 and fs.size(1) == 5


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_and_float_indices_raise_index_error(tmp_path, device):
    path, a = table(str(tmp_path), "r.npy", 100, 4, np.float32)
    fs = FeatureStore(path, device=device)
    for bad in (100, -101, 1 << 40):
        with pytest.raises(IndexError, match=str(bad)):
            fs.gather(torch.tensor([0, bad, 1]).to(device))
    with pytest.raises(IndexError, match="100"):
        fs[100]
    with pytest.raises(IndexError):
        fs.gather(torch.tensor([1.0]))
    with pytest.raises(IndexError, match="555"):
        fs.prefetch([555])
    assert fs.stats()["requests"] == 0  # nothing was counted for refused calls


def test_raw_tables_with_shape_and_dtype(place):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((333, 129)).astype(np.float32)
    path = os.path.join(place, "raw.bin")
    with open(path, "wb") as f:
        f.write(b"H" * 64 + a.tobytes())
    fs = FeatureStore(path, shape=(333, 129), dtype=np.float32, offset=64, host_bytes=40000)
    check_gathers(fs, a)
    fs2 = FeatureStore(path, shape=(-1, 129), dtype=torch.float32, offset=64)
    assert fs2.shape == (333, 129)
    bf = torch.from_numpy(a).to(torch.bfloat16)
    path3 = os.path.join(place, "raw_bf16.bin")
    with open(path3, "wb") as f:
        f.write(bf.view(torch.int16).numpy().tobytes())
    fs3 = FeatureStore(path3, shape=(333, 129), dtype=torch.bfloat16, host_bytes=3 * 4096)
    idx = zipf(333, 400, 2)
    assert torch.equal(fs3.gather(idx), bf[torch.from_numpy(idx)])
    with pytest.raises(ValueError, match="raw.bin"):
        FeatureStore(path)  # neither .npy nor shape and dtype
    with pytest.raises(ValueError, match="truncated"):
        FeatureStore(path, shape=(334, 129), dtype=np.float32, offset=64)


def test_malformed_files_are_refused_naming_them(tmp_path):
    d = str(tmp_path)
    cases = {
        "fortran.npy": (np.asfortranarray(np.ones((10, 3), np.float32)), "Fortran"),
        "three_d.npy": (np.ones((2, 3, 4), np.float32), "2-D"),
        "one_d.npy": (np.ones(7, np.float32), "2-D"),
        "object.npy": (np.array([[1, "a"]], dtype=object), "object"),
        "structured.npy": (np.zeros((3, 2), dtype=[("a", "<i4"), ("b", "<f4")]), "structured"),
    }
    for name, (arr, what) in cases.items():
        path = os.path.join(d, name)
        np.save(path, arr, allow_pickle=True)
        with pytest.raises(ValueError, match=what) as e:
            FeatureStore(path)
        assert name in str(e.value)
    path = os.path.join(d, "trunc.npy")
    np.save(path, np.ones((100, 8), np.float32))
    os.truncate(path, 128 + 100 * 32 - 1)
    with pytest.raises(ValueError, match="trunc.npy"):
        FeatureStore(path)
    path = os.path.join(d, "badheader.npy")
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4 x}\n")
    with pytest.raises(ValueError, match="badheader.npy"):
        FeatureStore(path)
    with pytest.raises(FileNotFoundError):
        FeatureStore(os.path.join(d, "missing.npy"))
    with pytest.raises(ValueError, match="policy"):
        FeatureStore(os.path.join(d, "trunc.npy"), policy="fifo")


def test_npy_header_versions_and_offsets(tmp_path):
    a = np.arange(60, dtype=np.int32).reshape(12, 5)
    for version in ((1, 0), (2, 0), (3, 0)):
        path = os.path.join(str(tmp_path), f"v{version[0]}.npy")
        with open(path, "wb") as f:
            np.lib.format.write_array(f, a, version=version)
        info = open_table(path)
        assert info.shape == (12, 5) and info.dtype == np.int32
        mm = np.load(path, mmap_mode="r")  # unmodified readers agree on the offset
        assert info.offset == mm.offset
        np.testing.assert_array_equal(FeatureStore(path).gather([11, 0, 5]).numpy(), a[[11, 0, 5]])


def run_batches(fs, batches, window, check=None):
    for b in batches[:window]:
        fs.prefetch(b)
    for i, b in enumerate(batches):
        if i + window < len(batches):
            fs.prefetch(batches[i + window])
        fs.gather(b)
        if check is not None:
            check(fs)
    return fs.stats()


@pytest.mark.parametrize("policy", _line_cache.POLICIES)
def test_policy_invariants(tmp_path, policy):
    rows, width = 20000, 64  # 256 B rows: 16 a line, 1250 lines
    path, a = table(str(tmp_path), "p.npy", rows, width, np.float32)
    score = np.random.default_rng(4).random(rows)
    fs = FeatureStore(path, host_bytes=200 * 4096, hot=300, score=score, window=3, policy=policy,
                      victim_bytes=20 * 4096)
    tiers = fs._tiers
    hot = tiers.hot_lines.copy()
    hot_bytes = tiers.hot.copy()
    assert 0 < len(hot) <= 100
    top = np.argsort(-score)[:300] // fs.rows_per_line
    assert np.isin(hot, top).all()
    batches = [zipf(rows, 1500, s) for s in range(25)] + [np.random.default_rng(s).integers(0, rows, 1500)
                                                          for s in range(10)]

    def check(fs):
        tiers.directory.check(hot=hot)  # capacity, one slot per line, hot lines never cached
        assert (tiers.directory.line_of_slot >= 0).sum() <= tiers.directory.capacity
        np.testing.assert_array_equal(tiers.hot_lines, hot)  # hot lines never leave
        np.testing.assert_array_equal(tiers.hot, hot_bytes)
        assert len(tiers.victims) <= tiers.victims.capacity
        if len(tiers.victims):  # victims only where the window reuses them
            held = np.fromiter(tiers.victims.slot_of_line.keys(), dtype=np.int64)
            assert (fs.window.next_reuse(held) != _line_cache._FAR).all()

    s = run_batches(fs, batches, 3, check)
    assert s["requests"] == 35 * 1500
    assert s["requests"] == s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
    assert s["hot_hits"] > 0 and s["cache_hits"] > 0 and s["storage_rows"] > 0
    assert s["evictions"] > 0 or policy == "static"
    # Storage moves whole lines: each gather that waited for it (a stall) read
    # at least one line, each line read serves at least one row asked of
    # storage, and moves at most the 4 KiB blocks it touches (a 4096 B line
    # at the .npy's 128 B data offset touches two; the posix reader moves the
    # line alone).
    assert s["stalls"] > 0
    assert s["stalls"] * fs.line_bytes <= s["ssd_bytes"] <= s["storage_rows"] * (fs.line_bytes + 4096)
    assert s["read_amplification"] == pytest.approx(s["ssd_bytes"] / (s["storage_rows"] * a.itemsize * width))
    # The static policy converges to the best lines it has seen.
    if policy == "static":
        held = tiers.directory.line_of_slot[tiers.directory.line_of_slot >= 0]
        assert len(held) == tiers.directory.capacity


def test_victim_buffer_serves_lines_the_window_reuses(tmp_path):
    # A loop over 40 lines through a 16-line cache: LRU evicts each line
    # before its reuse; the window sees the reuse coming and parks victims.
    rows, width = 40 * 16, 64
    path, a = table(str(tmp_path), "loop.npy", rows, width, np.float32)
    batches = [np.arange(i * 16 * 8, (i + 1) * 16 * 8) % rows for i in range(20)]
    hits = {}
    for policy in _line_cache.POLICIES:
        fs = FeatureStore(path, host_bytes=16 * 4096, window=4, policy=policy, victim_bytes=8 * 4096)
        s = run_batches(fs, batches, 4)
        assert s["requests"] == s["cache_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
        hits[policy] = s["requests"] - s["storage_rows"]
        if policy == "lru":
            assert s["victims_stored"] > 0 and s["victim_hits"] + s["victims_restored"] > 0
    assert hits["hybrid"] >= hits["lru"]


def test_line_directory_units():
    d = _line_cache.LineDirectory(10, 3, "lru")
    slots, ev, ev_slots, reuse = d.admit(np.array([1, 2, 3]), stamp=1)
    assert sorted(slots.tolist()) == [0, 1, 2] and len(ev) == 0
    d.touch(d.lookup(np.array([1])), 2)
    slots, ev, ev_slots, reuse = d.admit(np.array([4]), stamp=2)
    assert ev.tolist() == [2] and slots.tolist() == ev_slots.tolist()  # LRU victim; line 1 was touched
    d.check()
    st = _line_cache.LineDirectory(10, 2, "static", line_score=np.arange(10.0))
    st.admit(np.array([5, 6]), 1)
    slots, ev, _, _ = st.admit(np.array([1]), 2)  # scores lower than both: not admitted
    assert slots.tolist() == [-1] and len(ev) == 0
    slots, ev, _, _ = st.admit(np.array([9]), 3)
    assert ev.tolist() == [5]
    w = _line_cache.Window(2)
    w.push([3, 4])
    w.push([5])
    w.push([6])
    assert w.next_reuse(np.array([3, 5, 6, 7])).tolist() == [1, 2, _line_cache._FAR, _line_cache._FAR]
    vb = _line_cache.VictimBuffer(1)
    assert vb.place(np.array([7, 3]), w.next_reuse(np.array([7, 3]))).tolist() == [-1, 0]
    assert vb.take(np.array([3])).tolist() == [0]


def test_hybrid_evicts_the_line_the_window_needs_last():
    # Two cached lines; the window's next batch uses line 0, batches 3 and 4
    # use line 1, batch 2 the missing line 2. Counting window uses would keep
    # line 1 (two uses) and evict line 0 just before its reuse; the look-ahead
    # keeps the line needed soonest and parks line 1 (reused in 3 batches).
    d = _line_cache.LineDirectory(10, 2, "hybrid", line_score=np.zeros(10))
    d.admit(np.array([0, 1]), stamp=1)
    w = _line_cache.Window(4)
    for batch in ([0], [2], [1], [1]):
        w.push(batch)
    slots, ev, ev_slots, reuse = d.admit(np.array([2]), stamp=2, window=w)
    assert ev.tolist() == [1] and reuse.tolist() == [3] and slots.tolist() == ev_slots.tolist()
    assert d.lookup(np.array([0, 1, 2])).tolist()[0] >= 0 and d.lookup(np.array([1]))[0] == -1
    # Between lines the window does not use, the score decides, then recency.
    d = _line_cache.LineDirectory(10, 3, "hybrid", line_score=np.array([5.0, 1, 1, 9, 0, 0, 0, 0, 0, 7]))
    d.admit(np.array([0, 1, 2]), stamp=1)
    d.touch(d.lookup(np.array([1])), 2)
    slots, ev, _, _ = d.admit(np.array([9]), stamp=3, window=_line_cache.Window(4))
    assert ev.tolist() == [2]  # lines 1 and 2 score alike; 2 was used less recently
    slots, ev, _, _ = d.admit(np.array([4]), stamp=4)  # scores below all: not admitted
    assert slots.tolist() == [-1] and len(ev) == 0
    d.check()


def test_scores():
    # A star: every leaf points at node 0; node 0 points at leaf 1.
    indptr = np.array([0, 1, 2, 3, 4, 5])
    indices = np.array([1, 0, 0, 0, 0])
    pr = reverse_pagerank(indptr, indices)
    assert abs(pr.sum() - 1) < 1e-9 and pr.argmax() == 0 and pr[1] > pr[2]
    assert degree_score(indptr).tolist() == [1, 1, 1, 1, 1]


def test_hot_from_graph(tmp_path):
    path, a = table(str(tmp_path), "g.npy", 100, 1024, np.float32)
    indptr = np.arange(101) * 2
    indices = np.concatenate([[7, 8]] * 100)
    fs = FeatureStore(path, hot=2, score="pagerank", graph=(indptr, indices), host_bytes=10 * 4096)
    assert sorted(fs._tiers.hot_lines.tolist()) == [7, 8]
    x = fs.gather([7, 8, 7])
    np.testing.assert_array_equal(x.numpy(), a[[7, 8, 7]])
    assert fs.stats()["hot_hits"] == 3
    fs2 = FeatureStore(path, hot=[3, 99], host_bytes=10 * 4096)
    assert sorted(fs2._tiers.hot_lines.tolist()) == [3, 99]
    with pytest.raises(ValueError, match="score"):
        FeatureStore(path, hot=5)


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")
def test_cuda_concurrent_gathers_from_several_streams(tmp_path):
    import threading
    path, a = table(str(tmp_path), "c.npy", 5000, 100, np.float32)
    fs = FeatureStore(path, device="cuda", gpu_cache_bytes=64 * 4096, host_bytes=32 * 4096, hot=200,
                      score=np.random.default_rng(0).random(5000), window=2)
    errors = []

    def worker(seed):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for k in range(10):
                    idx = zipf(5000, 800, seed * 100 + k)
                    x = fs.gather(torch.from_numpy(idx).cuda())
                    stream.synchronize()
                    np.testing.assert_array_equal(x.cpu().numpy(), a[idx])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = fs.stats()
    assert s["requests"] == 4 * 10 * 800
    assert s["requests"] == s["gpu_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
    assert s["gpu_hits"] > 0 and s["hot_hits"] > 0


def test_the_library_reads_a_mount_by_the_direct_path(mount):
    from spillfs import _native
    if _native.segment_io() is None:
        pytest.skip("no libspillfs_client (set SPILLFS_CLIENT_LIB)")
    path, a = table(mount, "direct.npy", 3000, 100, np.float32)
    fs = FeatureStore(path, host_bytes=16 * 4096)
    assert fs.reader.backend == "direct_path"
    check_gathers(fs, a)
    s = fs.stats()
    assert s["ssd_reads"] > 0 and s["ssd_bytes"] >= s["ssd_reads"] * 4096


def test_hybrid_hits_more_than_lru_and_static_on_sampled_batches(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "tools", "bench"))
    import gnn_graph
    d = str(tmp_path)
    gnn_graph.generate(d, 13, 16, 256, torch.float32, device="cpu")
    indptr = torch.from_numpy(np.load(os.path.join(d, "indptr.npy")))
    indices = torch.from_numpy(np.load(os.path.join(d, "indices.npy")))
    gen = torch.Generator().manual_seed(1)
    batches = [gnn_graph.sample(indptr, indices, torch.randint(0, 1 << 13, (64,), generator=gen), [10, 5],
                                generator=gen)[0] for _ in range(20)]
    score = reverse_pagerank(indptr, indices)
    rates = {}
    for policy in _line_cache.POLICIES:
        fs = FeatureStore(os.path.join(d, "feat.npy"), host_bytes=200 * 4096, policy=policy, window=4, score=score,
                          victim_bytes=0)
        rates[policy] = run_batches(fs, batches, 4)["hit_rate"]
    assert rates["hybrid"] > rates["lru"] and rates["hybrid"] > rates["static"], rates


@pytest.mark.parametrize("policy", _line_cache.POLICIES)
def test_gpu_tiers_on_an_emulated_cache(tmp_path, monkeypatch, policy):
    """The CUDA path's orchestration (spillfs.gnn._store.gpu_cache) over fake_gpu_cache's
    numpy emulation of spill_gpu_cache_*: CI checks it without a GPU."""
    from spillfs.gnn._store import gpu_cache as _gpu_cache
    from spillfs.gnn._store.feature_store import _Stats
    import fake_gpu_cache
    fake = fake_gpu_cache.FakeGpuCacheLibrary()
    monkeypatch.setattr(_gpu_cache, "_library", lambda: fake)
    rows, width = 3001, 64  # 16 rows a line, the last line partial
    path, a = table(str(tmp_path), "emu.npy", rows, width, np.float32)
    score = np.random.default_rng(9).random(rows)
    fs = FeatureStore(path, host_bytes=64 * 4096, hot=200, score=score, window=3, policy=policy)
    fs._tiers = _gpu_cache.GpuTiers(fs, 24 * 4096, 48 * 4096, None, fs._hot_lines(200, fs.row_score))
    fs._stats = _Stats()
    tiers = fs._tiers
    tiers.staging = tiers.staging[:7]  # several fills a batch
    assert len(tiers.hot_lines) > 0 and tiers.victims.capacity == 12
    batches = [zipf(rows, 600, s) for s in range(15)] + [np.arange(rows)]
    for b in batches[:3]:
        fs.prefetch(b)
    for i, b in enumerate(batches):
        if i + 3 < len(batches):
            fs.prefetch(batches[i + 3])
        got = fs.gather(torch.from_numpy(b))
        np.testing.assert_array_equal(got.numpy(), a[b])
        tiers.directory.check(hot=tiers.hot_lines)
        c = fake.caches[tiers.cache]
        held = np.flatnonzero(c.slot_of_line >= 0)  # the emulated GPU directory = the host's
        np.testing.assert_array_equal(np.sort(held), np.sort(tiers.directory.line_of_slot[
            tiers.directory.line_of_slot >= 0]))
    s = fs.stats()
    assert s["requests"] == sum(len(b) for b in batches)
    assert s["requests"] == s["gpu_hits"] + s["hot_hits"] + s["victim_hits"] + s["storage_rows"]
    assert s["gpu_hits"] > 0 and s["hot_hits"] > 0 and s["storage_rows"] > 0
    assert fake.calls["fill"] > fake.calls["gather"]  # staging of 7 lines: several fills a batch
    if policy == "lru":
        assert s["victims_stored"] > 0 and s["victim_hits"] + s["victims_restored"] > 0
    with pytest.raises(IndexError, match="3001"):
        fs.gather(torch.tensor([3001]))
    with pytest.raises(IndexError, match="-3002"):  # refused by the (emulated) kernel: nothing counted
        fs.gather(torch.tensor([5, -3002], dtype=torch.int32))
    assert fs.stats()["requests"] == s["requests"]
    neg = torch.tensor([-1, 0, -3001, -17])  # negatives count from the end, in the kernel
    np.testing.assert_array_equal(fs.gather(neg).numpy(), a[neg.numpy()])
