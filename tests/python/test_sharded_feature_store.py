"""spillfs.gnn.ShardedFeatureStore over torch.distributed with gloo on the CPU:
2 and 3 processes (sharded_worker.py, a group made with init_method file://)
over .npy tables in a tmp dir and over shard files (write_shards). Gathers
equal numpy indexing (random, Zipf, boundary, duplicate indices, batches of
different sizes per rank, empty ones included), each line is cached only on its
owner, each shard keeps the eviction invariants, stats add up, out-of-range
indices raise IndexError on every rank naming the index; a process that dies
makes the others raise PeerError at once, and one that stops calling makes them
raise it after the group's timeout."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from spillfs.gnn import ShardedFeatureStore, write_shards

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "sharded_worker.py")
CHECKS = ["t_rows_equal_numpy", "t_rows_wider_than_a_block_and_int16", "t_shard_files",
          "t_eviction_invariants_per_shard", "t_emulated_gpu_shards", "t_out_of_range_raises_on_every_rank"]

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def make_data(d):
    rng = np.random.default_rng(0)
    np.save(os.path.join(d, "f32.npy"), rng.standard_normal((1237, 13)).astype(np.float32))  # 78 rows a line
    np.save(os.path.join(d, "wide.npy"), rng.standard_normal((97, 1100)).astype(np.float32))  # 4400 B rows
    np.save(os.path.join(d, "i16.npy"), rng.integers(-30000, 30000, (3001, 64), dtype=np.int16))  # 32 a line
    bf = torch.from_numpy(rng.standard_normal((501, 40)).astype(np.float32)).to(torch.bfloat16)
    torch.save(bf, os.path.join(d, "bf16.pt"))
    with open(os.path.join(d, "bf16.bin"), "wb") as f:
        f.write(bf.view(torch.int16).numpy().tobytes())
    for world in (2, 3):
        for partition in ("hash", "range"):
            write_shards(os.path.join(d, "f32.npy"), os.path.join(d, f"shards-{partition}-{world}"), world, partition)
        write_shards(os.path.join(d, "bf16.bin"), os.path.join(d, f"shards-bf16-{world}"), world, "range",
                     shape=(501, 40), dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both groups (2 and 3 ranks) at once; {world: [each rank's results]}."""
    d = str(tmp_path_factory.mktemp("sharded"))
    make_data(d)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = {}
    t0 = time.time()
    for world in (2, 3):
        procs[world] = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), d,
                                          os.path.join(d, f"out-{world}-{r}.json")], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                        for r in range(world)]
    logs = {}
    for world, ps in procs.items():
        for r, p in enumerate(ps):
            try:
                logs[(world, r)] = p.communicate(timeout=max(5, 150 - (time.time() - t0)))[0]
            except subprocess.TimeoutExpired:
                p.kill()
                logs[(world, r)] = "TIMED OUT\n" + p.communicate()[0]
    out = {}
    for world in (2, 3):
        out[world] = []
        for r in range(world):
            path = os.path.join(d, f"out-{world}-{r}.json")
            res = json.load(open(path)) if os.path.exists(path) else {}
            res["_log"] = logs[(world, r)][-4000:]
            res["_rc"] = procs[world][r].returncode
            out[world].append(res)
    for world in (2, 3):
        print(f"world {world}: " + ", ".join(f"{k} {v:.2f} s" for k, v in out[world][0].items()
                                             if k.endswith("_seconds")))
    print(f"both groups: {time.time() - t0:.1f} s")
    return out


def _assert_ok(res, key, rank):
    got = res.get(key)
    assert got == "ok", f"rank {rank}: {key}: {got}\n--- log ---\n{res['_log']}"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("check", CHECKS)
def test_sharded_store(runs, world, check):
    for rank, res in enumerate(runs[world]):
        _assert_ok(res, check, rank)


def test_dead_peer_raises_a_clear_error(runs):
    ranks = runs[3]
    assert ranks[2]["_rc"] == 17  # the rank that died
    for rank in (0, 1):
        _assert_ok(ranks[rank], "dead_peer", rank)
        assert ranks[rank]["dead_peer_seconds"] < 15, ranks[rank]
        _assert_ok(ranks[rank], "dead_peer_after", rank)
        assert ranks[rank]["_rc"] == 0, ranks[rank]["_log"]


def test_stalled_peer_raises_after_the_timeout(runs):
    res = runs[2][0]
    _assert_ok(res, "stalled_peer", 0)
    assert 1.5 <= res["stalled_peer_seconds"] < 4.5, res
    assert "timeout" in res["stalled_peer_message"].lower() or "timed out" in res["stalled_peer_message"].lower()


def test_needs_a_group(tmp_path, monkeypatch):
    for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    np.save(tmp_path / "t.npy", np.zeros((10, 2), np.float32))
    if dist.is_initialized():
        pytest.skip("a default group exists in this process")
    with pytest.raises(RuntimeError, match="torchrun"):
        ShardedFeatureStore(str(tmp_path / "t.npy"))


def test_layouts():
    """Every row has exactly one owner; a rank's lines keep their order in its shard."""
    from spillfs.gnn._store.sharded import _Layout
    lay = _Layout(1000, 7, 3, "range")
    assert lay.n_lines == 143 and lay.lines_per_rank == 48
    assert sorted(np.concatenate([lay.owned_rows(r) for r in range(3)]).tolist()) == list(range(1000))
    lay = _Layout(1000, 7, 3, "hash")
    assert sorted(np.concatenate([lay.owned_rows(r) for r in range(3)]).tolist()) == list(range(1000))
    assert (lay.local_lines(lay.owned_lines(2)) == np.arange(len(lay.owned_lines(2)))).all()
    with pytest.raises(ValueError, match="partition"):
        _Layout(10, 1, 2, "round")
