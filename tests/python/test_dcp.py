"""spillfs.dcp: torch.distributed.checkpoint save / load / async_save with
SpillWriter and SpillReader on a spillfs mount, by real gloo groups of 2 and 3
processes (dcp_worker.py, init_method file://) over DTensors sharded on a CPU
mesh. Values come back exactly, at the world that saved them and resharded
(2 -> 3, 3 -> 1, 2 -> 1); a second save with 1 tensor of 100 changed writes a
few percent of the first's bytes to the SSD (the volume's counters and the
writer's report); checkpoints go both ways between spillfs.dcp and DCP's
FileSystemWriter / FileSystemReader; bad input raises what DCP raises."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from spillfs import _native

dcp = pytest.importorskip("torch.distributed.checkpoint", reason="this torch has no torch.distributed.checkpoint")
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402

from spillfs.dcp import SpillReader, SpillWriter  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dcp_worker.py")
sys.path.insert(0, HERE)

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="torch.distributed with gloo is not available"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*overwriting.*:UserWarning"),
]


def _group(world, mount, d, timeout):
    """Runs dcp_worker.py as `world` ranks; each rank's results (with its log and exit status)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    outs = [os.path.join(d, f"out-{world}-{r}.json") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), mount, outs[r]], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    t0 = time.time()
    ranks = []
    for r, p in enumerate(procs):
        try:
            log = p.communicate(timeout=max(5, timeout - (time.time() - t0)))[0]
        except subprocess.TimeoutExpired:
            p.kill()
            log = "TIMED OUT\n" + p.communicate()[0]
        res = json.load(open(outs[r])) if os.path.exists(outs[r]) else {}
        res["_log"], res["_rc"] = log[-4000:], p.returncode
        ranks.append(res)
    return ranks


@pytest.fixture(scope="module")
def runs(mount, tmp_path_factory):
    """The 2-rank group (saves, loads), then the 3-rank one (loads resharded,
    saves); {world: [each rank's results]}."""
    d = str(tmp_path_factory.mktemp("dcp"))
    return {world: _group(world, mount, d, timeout=120) for world in (2, 3)}


def _ok(runs, world, name):
    for r, res in enumerate(runs[world]):
        assert res.get(name) == "ok", f"world {world} rank {r} {name}: {res.get(name)}\n(rc {res['_rc']})\n{res['_log']}"


@pytest.mark.parametrize("world,name", [(2, "t_save_twice_second_writes_little"), (2, "t_async_save"),
                                        (2, "t_stock_save"), (2, "t_load_same_world"),
                                        (3, "t_load_resharded"), (3, "t_save_3_ranks")])
def test_group_checks(runs, world, name):
    _ok(runs, world, name)


def test_second_save_with_1_percent_changed_writes_far_less(runs):
    """step2 differs from step1 in 1 tensor of 100 (each rank's shard of it one
    256 KiB unit): the volume shares the other units. The SSD's bytes written
    (`spillfs stat`) and the writers' reports say so."""
    _ok(runs, 2, "t_save_twice_second_writes_little")
    r0 = runs[2][0]
    first, second = r0["step1_ssd"], r0["step2_ssd"]
    data = 100 * 128 * 1024 * 4  # the 100 tensors' bytes, all ranks
    print(f"bytes_written_ssd: first save {first}, second save {second}; "
          f"deduplicated {r0['step2_deduplicated']}")
    assert r0["step1_report"]["io_path"] == "direct_path", r0["step1_report"]
    assert first >= data
    assert second < 0.1 * first, (first, second)
    assert r0["step2_deduplicated"] >= 0.9 * data
    for res in runs[2]:
        one, two = res["step1_report"], res["step2_report"]
        assert one["bytes_shared"] == 0 and one["bytes_written"] >= data // 2, one
        assert two["bytes_shared"] >= 98 * 256 * 1024, two  # 99 unchanged units of 256 KiB a rank
        assert two["bytes_written"] < 0.1 * one["bytes_written"], (one, two)


def test_async_save_goes_through_spillfs(runs):
    _ok(runs, 2, "t_async_save")
    for res in runs[2]:
        rep = res["async_report"]
        assert rep["backend"] == "native" and rep["io_path"] == "direct_path", rep
        assert rep["bytes_shared"] > 0, rep  # step2's units, already on the volume


# -- in this process: one rank ----------------------------------------------------

def _full(step=2):
    from dcp_worker import global_state
    return global_state(step)


def _zeros(full):
    return {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else {"step": 0, "name": ""})
            for k, v in full.items()}


def _same(full, got):
    for k, v in full.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
        else:
            assert got[k] == v, k


@pytest.mark.parametrize("name,reader", [("step3", SpillReader), ("step3", FileSystemReader),
                                         ("step2", SpillReader), ("stock", SpillReader)])
def test_loaded_by_one_rank(runs, mount, name, reader):
    """The 3-rank and 2-rank checkpoints loaded whole by one process (plain tensors)."""
    _ok(runs, 3 if name == "step3" else 2, "t_save_3_ranks" if name == "step3" else "t_stock_save")
    full = _full(2)
    got = _zeros(full)
    dcp.load(got, storage_reader=reader(os.path.join(mount, name)))
    _same(full, got)


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - compared below
        return e
    raise AssertionError("nothing raised")


def test_missing_checkpoint_raises_as_dcp_does(tmp_path):
    """No directory: DCP's error, from either reader (the .metadata file named where DCP names it:
    torch 2.11's load reports only "metadata is None", from both)."""
    missing = str(tmp_path / "nope")
    ours = _raised(lambda: dcp.load({"a": torch.zeros(3)}, storage_reader=SpillReader(missing)))
    stock = _raised(lambda: dcp.load({"a": torch.zeros(3)}, storage_reader=FileSystemReader(missing)))
    assert type(ours) is type(stock), (ours, stock)
    named = os.path.join(missing, ".metadata")
    assert (named in str(ours)) == (named in str(stock)), (ours, stock)
    assert named in str(ours) or "metadata is None" in str(ours), ours


def test_missing_distcp_file_names_it(tmp_path):
    sd = {"a": torch.arange(300000, dtype=torch.float32), "b": torch.ones(3)}
    path = str(tmp_path / "ck")
    writer = SpillWriter(path)
    dcp.save(sd, storage_writer=writer)
    assert writer.report.backend in ("native", "posix") and writer.report.bytes_written > 0
    assert [n for n in os.listdir(path) if "spillfs-tmp" in n] == []
    shutil.copytree(path, str(tmp_path / "ck2"))
    os.remove(os.path.join(str(tmp_path / "ck2"), "__0_0.distcp"))
    target = {"a": torch.zeros(300000), "b": torch.zeros(3)}
    err = _raised(lambda: dcp.load(target, storage_reader=SpillReader(str(tmp_path / "ck2"))))
    assert isinstance(err, (FileNotFoundError, dcp.api.CheckpointException)), err
    assert "__0_0.distcp" in str(err)
    dcp.load(target, storage_reader=SpillReader(path))
    assert torch.equal(target["a"], sd["a"]) and torch.equal(target["b"], sd["b"])


def test_bad_arguments_raise_value_error(tmp_path):
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    with pytest.raises(ValueError, match="TORCH_SAVE"):
        SpillWriter(str(tmp_path), serialization_format=SerializationFormat.SAFETENSORS)
    with pytest.raises(ValueError, match="backend"):
        SpillWriter(str(tmp_path), backend="nvme")
    with pytest.raises(ValueError, match="backend"):
        SpillReader(str(tmp_path), backend="nvme")


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path):
    path = str(tmp_path / "ck")
    dcp.save({"a": torch.ones(4)}, storage_writer=SpillWriter(path))
    err = _raised(lambda: dcp.save({"a": torch.ones(4)}, storage_writer=SpillWriter(path, overwrite=False)))
    stock = _raised(lambda: dcp.save({"a": torch.ones(4)}, storage_writer=FileSystemWriter(path, overwrite=False)))
    assert type(err) is type(stock) and "already exists" in str(err), (err, stock)


def test_posix_backend_reports_it(tmp_path):
    """Without the library's I/O the report says so (no silent fallback); the files are the same format."""
    sd = {"w": torch.randn(200, 1024), "b": torch.arange(5)}
    writer = SpillWriter(str(tmp_path / "p"), backend="posix")
    dcp.save(sd, storage_writer=writer)
    assert writer.report.backend == "posix" and writer.report.io_path == "posix", writer.report
    got = {"w": torch.zeros(200, 1024), "b": torch.zeros(5, dtype=torch.int64)}
    dcp.load(got, storage_reader=FileSystemReader(str(tmp_path / "p")))
    assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"])
    if _native.segment_io() is None:
        pytest.skip("libspillfs_client with the segment I/O is not available: the native backend untested")
    native = SpillWriter(str(tmp_path / "n"))
    dcp.save(sd, storage_writer=native)
    assert native.report.backend == "native", native.report
