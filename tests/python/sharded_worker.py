"""One rank of test_sharded_feature_store.py: a gloo group of WORLD processes
(init_method file://) running the checks on spillfs.gnn.ShardedFeatureStore,
then a failure scenario. Writes {check: "ok" | traceback} to OUT (JSON).

    python3 sharded_worker.py RANK WORLD DATA_DIR OUT_JSON
"""

import datetime
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from spillfs.gnn._store import line_cache as _line_cache  # noqa: E402
from spillfs.gnn import FeatureStore, PeerError, ShardedFeatureStore  # noqa: E402
from worker_results import Results  # noqa: E402

RANK, WORLD, DATA, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
results = Results(OUT)
save = results.save


def check(fn):
    results.check(fn, dist.barrier)


def zipf(rows, n, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows)
    return perm[(rng.zipf(1.3, n) - 1) % rows]


def batches_for(rows, rank, seed):
    """Random, skewed, boundary, duplicate and empty batches, sized differently per rank."""
    rng = np.random.default_rng(seed * 100 + rank)
    out = [rng.integers(0, rows, 50 + 37 * rank), zipf(rows, 300 + 50 * rank, seed + rank),
           np.array([0, rows - 1, -1, -rows, 0, rows - 1, 0]), np.full(9, rows // 2),
           np.arange(rows) if rank == 0 else np.array([], dtype=np.int64),
           np.array([], dtype=np.int64) if rank == WORLD - 1 else rng.integers(0, rows, 5)]
    return out


def held_lines(store):
    t = store.local._tiers
    d = t.directory
    victims = np.fromiter(t.victims.slot_of_line.keys(), dtype=np.int64, count=len(t.victims))
    return np.concatenate([d.line_of_slot[d.line_of_slot >= 0], t.hot_lines, victims])


def assert_owned(store):
    """Each line this rank's shard holds (cache, hot, victims) is one it owns."""
    lines = held_lines(store)
    if store.sharded_files:
        assert (lines < len(store.layout.owned_lines(store.rank))).all()
    else:
        assert (store.layout.owner_of_lines(lines) == store.rank).all(), "a line cached off its owner"


def assert_stats(store):
    s = store.stats()
    assert s["requests"] == s["local_rows"] + s["remote_rows"]
    assert s["remote_unique_rows"] <= s["remote_rows"]
    assert s["served_rows"] == s["remote_hits"] + s["remote_storage_rows"]
    sh = s["shard"]
    assert sh["requests"] == sh["gpu_hits"] + sh["cache_hits"] + sh["hot_hits"] + sh["victim_hits"] + \
        sh["storage_rows"]
    agg = store.stats(aggregate=True)
    assert agg["remote_unique_rows"] == agg["served_rows"], agg
    assert agg["bytes_sent"] == agg["bytes_received"], agg
    assert agg["requests"] == sum(r["requests"] for r in agg["ranks"])
    assert agg["shard"]["requests"] == sum(r["shard"]["requests"] for r in agg["ranks"])
    assert [r["rank"] for r in agg["ranks"]] == list(range(WORLD))
    assert sum(r["owned_rows"] for r in agg["ranks"]) == store.rows
    return s, agg


def gathers_equal(path, a, **kw):
    for partition in ("hash", "range"):
        store = ShardedFeatureStore(path, partition=partition, **kw)
        assert store.shape == a.shape and store.dtype == torch.from_numpy(a[:1]).dtype
        for seed, batch in enumerate(batches_for(len(a), RANK, 1)):
            got = store.gather(torch.from_numpy(np.asarray(batch, dtype=np.int64)))
            assert got.shape == (len(batch), a.shape[1]), (got.shape, batch)
            np.testing.assert_array_equal(got.numpy(), a[batch])
            assert_owned(store)
        np.testing.assert_array_equal(store[[3, 3, 1]].numpy(), a[[3, 3, 1]])
        np.testing.assert_array_equal(store[-1].numpy(), a[-1])
        s, agg = assert_stats(store)
        assert s["served_rows"] > 0 and s["remote_rows"] > 0
        assert agg["shard"]["requests"] <= agg["requests"]  # unions: rows asked by several ranks read once
        owners = store.owner(np.arange(len(a)))
        assert set(owners.tolist()) == set(range(WORLD))
        assert (np.flatnonzero(owners == RANK) == store.owned_rows).all()
        store.close()


def gathers_in_window(store, a, batches, window, check=None):
    """Gathers the batches in order, each announced ``window`` batches ahead
    (prefetch), and checks every one against numpy, that the shard holds only
    lines it owns, and ``check()`` after each."""
    for b in batches[:window]:
        store.prefetch(b)
    for i, b in enumerate(batches):
        if i + window < len(batches):
            store.prefetch(batches[i + window])
        np.testing.assert_array_equal(store.gather(b).numpy(), a[b])
        if check is not None:
            check()
        assert_owned(store)


def t_rows_equal_numpy():
    path = os.path.join(DATA, "f32.npy")
    a = np.load(path)
    gathers_equal(path, a, host_bytes=4 * 4096, window=0)
    one = FeatureStore(path, host_bytes=4 * 4096)
    store = ShardedFeatureStore(path, host_bytes=4 * 4096)
    idx = zipf(len(a), 500, 7 + RANK)
    assert torch.equal(store.gather(idx), one.gather(idx))  # the same rows as one store


def t_rows_wider_than_a_block_and_int16():
    path = os.path.join(DATA, "wide.npy")
    gathers_equal(path, np.load(path), host_bytes=3 * 4400, window=1)
    path = os.path.join(DATA, "i16.npy")
    gathers_equal(path, np.load(path), host_bytes=6 * 4096, window=2, policy="lru")


def t_shard_files():
    for partition in ("hash", "range"):
        a = np.load(os.path.join(DATA, "f32.npy"))
        store = ShardedFeatureStore(os.path.join(DATA, f"shards-{partition}-{WORLD}"), host_bytes=4 * 4096,
                                    window=2)
        assert store.partition == partition and store.sharded_files
        assert store.local.info.rows == len(store.owned_rows)
        np.testing.assert_array_equal(store.local.gather(np.arange(len(store.owned_rows))).numpy(),
                                      a[store.owned_rows])  # the shard holds exactly the owned rows
        gathers_in_window(store, a, batches_for(len(a), RANK, 3), 2)
        assert_stats(store)
    # A torch-only dtype (bfloat16, raw shard files).
    ref = torch.load(os.path.join(DATA, "bf16.pt"))
    store = ShardedFeatureStore(os.path.join(DATA, f"shards-bf16-{WORLD}"), host_bytes=4 * 4096)
    assert store.dtype == torch.bfloat16
    for b in batches_for(len(ref), RANK, 4):
        assert torch.equal(store.gather(b), ref[torch.from_numpy(np.asarray(b, dtype=np.int64))])


def t_eviction_invariants_per_shard():
    path = os.path.join(DATA, "i16.npy")
    a = np.load(path)
    rows = len(a)
    score = np.random.default_rng(4).random(rows)
    for policy in _line_cache.POLICIES:
        store = ShardedFeatureStore(path, host_bytes=20 * 4096, hot=8, score=score, window=3, policy=policy,
                                    victim_bytes=4 * 4096)
        tiers = store.local._tiers
        hot = tiers.hot_lines.copy()
        assert len(hot) > 0 and (store.layout.owner_of_lines(hot) == RANK).all()
        mine = store.owned_rows
        top = mine[np.argsort(-score[mine], kind="stable")[:8]] // store.rows_per_line
        assert np.isin(hot, top).all()  # this rank's hot rows: the best it owns
        batches = [zipf(rows, 60, 10 * s + RANK) for s in range(8)] + \
            [np.random.default_rng(s + RANK).integers(0, rows, 30) for s in range(4)]

        def invariants():
            tiers.directory.check(hot=hot)
            np.testing.assert_array_equal(tiers.hot_lines, hot)
            assert len(tiers.victims) <= tiers.victims.capacity
            if len(tiers.victims):  # victims only where the shard's window (every rank's requests) reuses them
                held = np.fromiter(tiers.victims.slot_of_line.keys(), dtype=np.int64)
                assert (store.local.window.next_reuse(held) != _line_cache._FAR).all()

        gathers_in_window(store, a, batches, 3, invariants)
        s, agg = assert_stats(store)
        sh = s["shard"]
        assert sh["hot_hits"] > 0 and sh["cache_hits"] > 0 and sh["storage_rows"] > 0, (policy, sh)
        assert sh["evictions"] > 0 or policy != "lru", (policy, sh)  # (hybrid, static: may keep what they hold)
        assert agg["remote_hits"] > 0 and 0 < agg["hit_rate"] <= 1
        assert s["prefetches"] == len(batches)


def t_emulated_gpu_shards():
    """Shards whose tiers are the CUDA path's (spillfs.gnn._store.gpu_cache.GpuTiers) over
    fake_gpu_cache's numpy emulation of spill_gpu_cache_*."""
    import fake_gpu_cache
    from spillfs.gnn._store import gpu_cache as _gpu_cache
    from spillfs.gnn._store.feature_store import _Stats
    fake = fake_gpu_cache.FakeGpuCacheLibrary()
    _gpu_cache._library = lambda: fake
    path = os.path.join(DATA, "i16.npy")
    a = np.load(path)
    rows = len(a)
    score = np.random.default_rng(5).random(rows)
    for partition in ("hash", "range"):
        store = ShardedFeatureStore(path, host_bytes=16 * 4096, hot=8, score=score, window=2, partition=partition)
        fs = store.local
        fs._tiers = _gpu_cache.GpuTiers(fs, 6 * 4096, 16 * 4096, None, fs._tiers.hot_lines)
        fs._stats = _Stats()
        tiers = fs._tiers
        assert len(tiers.hot_lines) and (store.layout.owner_of_lines(tiers.hot_lines) == RANK).all()
        batches = [zipf(rows, 80, 20 * s + RANK) for s in range(8)] + [np.array([], dtype=np.int64)]
        for b in batches[:2]:
            store.prefetch(b)
        for i, b in enumerate(batches):
            store.prefetch(batches[i + 2] if i + 2 < len(batches) else b[:0])
            np.testing.assert_array_equal(store.gather(torch.from_numpy(b)).numpy(), a[b])
            tiers.directory.check(hot=tiers.hot_lines)
            assert_owned(store)
            c = fake.caches[tiers.cache]  # the emulated GPU's lines = the host directory's, all owned
            held = np.flatnonzero(c.slot_of_line >= 0)
            assert (store.layout.owner_of_lines(held) == RANK).all()
        s, agg = assert_stats(store)
        assert agg["shard"]["gpu_hits"] > 0 and agg["shard"]["hot_hits"] > 0, agg["shard"]


def t_out_of_range_raises_on_every_rank():
    path = os.path.join(DATA, "f32.npy")
    a = np.load(path)
    store = ShardedFeatureStore(path, host_bytes=4 * 4096, window=1)
    bad = len(a) + 5
    idx = [0, bad] if RANK == 0 else [1, 2]
    try:
        store.gather(idx)
    except IndexError as e:
        assert str(bad) in str(e), e
        if RANK != 0:
            assert "rank 0" in str(e), e
    else:
        raise AssertionError("no IndexError")
    try:
        store.prefetch([-len(a) - 1] if RANK == WORLD - 1 else [3])
    except IndexError as e:
        assert str(-len(a) - 1) in str(e), e
    else:
        raise AssertionError("no IndexError from prefetch")
    b = [RANK, len(a) - 1 - RANK]
    np.testing.assert_array_equal(store.gather(b).numpy(), a[b])  # the ranks are still in step
    if RANK == 0:
        try:
            store.gather(torch.tensor([1.0]))
        except IndexError:
            pass
        else:
            raise AssertionError("no IndexError for a float index")
    else:
        try:
            store.gather([2])
        except IndexError as e:
            assert "rank 0" in str(e), e
        else:
            raise AssertionError("no IndexError from rank 0's float index")
    np.testing.assert_array_equal(store.gather(b).numpy(), a[b])


def gather_expecting_peer_error(name, store, index, *says):
    """store.gather(index), which must raise PeerError saying each of `says`:
    results[name] is "ok" or what happened instead, with the message and the
    seconds it took beside it."""
    t0 = time.perf_counter()
    try:
        store.gather(index)
        results[name] = "gather returned"
    except PeerError as e:
        results[name] = "ok" if all(s in str(e) for s in says) else str(e)
        results[name + "_message"] = str(e)
    except Exception:  # noqa: BLE001
        results[name] = traceback.format_exc()
    results[name + "_seconds"] = time.perf_counter() - t0


def scenario_dead_peer():
    """The last rank dies (os._exit) where the others gather: they raise PeerError."""
    path = os.path.join(DATA, "f32.npy")
    store = ShardedFeatureStore(path, host_bytes=4 * 4096, timeout=20)
    store.gather([RANK])
    dist.barrier()
    if RANK == WORLD - 1:
        save()
        os._exit(17)
    time.sleep(0.3)
    gather_expecting_peer_error("dead_peer", store, [0, 1, 2, 3, 4, 5, 6, 7] * 50, f"rank {RANK} of {WORLD}", "20 s")
    try:
        store.gather([0])
        results["dead_peer_after"] = "gather returned"
    except PeerError as e:
        results["dead_peer_after"] = "ok" if "unusable" in str(e) else str(e)
    save()


def scenario_stalled_peer():
    """The last rank stops calling (sleeps): the others raise PeerError after the
    group's timeout (a group of its own, 2 s)."""
    group = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=2))
    path = os.path.join(DATA, "f32.npy")
    store = ShardedFeatureStore(path, host_bytes=4 * 4096, group=group, timeout=2)
    store.gather([RANK])
    if RANK == WORLD - 1:
        save()
        time.sleep(4.5)
        os._exit(0)
    gather_expecting_peer_error("stalled_peer", store, [1, 2, 3], "2 s")
    save()


def main():
    dist.init_process_group("gloo", init_method="file://" + os.path.join(DATA, f"init-{WORLD}"), rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    for fn in (t_rows_equal_numpy, t_rows_wider_than_a_block_and_int16, t_shard_files,
               t_eviction_invariants_per_shard, t_emulated_gpu_shards, t_out_of_range_raises_on_every_rank):
        check(fn)
    if WORLD == 2:
        scenario_stalled_peer()
    else:
        scenario_dead_peer()
    save()
    os._exit(0)  # (a peer may be gone: no orderly teardown of the group)


if __name__ == "__main__":
    main()
