"""spillfs.save(..., background=True): the snapshot at the call, the write on the writer thread.

Run: .venv/bin/python -m pytest -q tests/python/test_background_save.py
The dedup case needs conftest.py's `mount` (root, /dev/fuse, SPILLFS_BIN) and
libspillfs_client; CUDA cases need a GPU; each skips saying why.

The writer thread is held up where a test needs the caller to act before the
write (a job that waits for an Event, queued on the same single writer): the
order is then certain, no sleep decides it.
"""

import concurrent.futures
import os
import pickle
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import spillfs  # noqa: E402  (conftest.py puts clients/python on sys.path)
from spillfs import _native  # noqa: E402
from spillfs.checkpoint import _background  # noqa: E402

from test_serialization import KIB, MIB, _physical_bytes, assert_same, sample  # noqa: E402


def _state(seed=0, n=4, numel=256 * KIB):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(numel, generator=g) for i in range(n)}


class _HeldWriter:
    """Holds the writer thread until released (or the `with` ends)."""

    def __enter__(self):
        self.go = threading.Event()
        self.job = _background._writer_pool().submit(self.go.wait, 30)
        return self

    def release(self):
        self.go.set()
        self.job.result()

    def __exit__(self, *exc):
        self.release()


@pytest.fixture(autouse=True)
def _nothing_pending():
    yield
    spillfs.checkpoint.wait(timeout=60)
    assert _background._pending_bytes == 0


@pytest.mark.parametrize("backend", ["auto", "posix"])
def test_the_file_is_what_a_synchronous_save_writes(tmp_path, backend):
    obj = {"bf16": sample(torch.bfloat16), "i64": sample(torch.int64), "q": sample(torch.qint8),
           "opt": {"step": 7, "m": torch.randn(100000)}, "name": "run-1"}
    (tmp_path / "sync").mkdir()
    (tmp_path / "bg").mkdir()
    sync_path, bg_path = tmp_path / "sync" / "ckpt.pt", tmp_path / "bg" / "ckpt.pt"  # one archive name
    report = spillfs.save(obj, sync_path, backend=backend)
    future = spillfs.save(obj, bg_path, backend=backend, background=True)
    assert isinstance(future, concurrent.futures.Future)
    got = future.result(timeout=60)
    assert isinstance(got, spillfs.IOReport) and got.op == "save" and got.path == str(bg_path)
    assert (got.storages, got.storage_bytes, got.file_bytes) == (report.storages, report.storage_bytes,
                                                                  report.file_bytes)
    assert {"pickle", "snapshot", "total"} <= set(got.seconds)
    assert_same(torch.load(sync_path), torch.load(bg_path))
    assert_same(obj, torch.load(bg_path))
    # the same archive byte for byte (CPU storages: real CRC-32s both ways)
    assert open(bg_path, "rb").read() == open(sync_path, "rb").read()
    assert os.listdir(tmp_path / "bg") == ["ckpt.pt"]


def test_the_file_holds_the_values_at_the_call(tmp_path):
    sd = _state(1)
    sd["small"] = torch.arange(10.0)
    at_call = {k: v.clone() for k, v in sd.items()}
    with _HeldWriter() as held:
        future = spillfs.save(sd, tmp_path / "snap.pt", background=True)
        # Without the snapshot the write would read the tensors as they are now
        # (the control: a save of the live tensors queued on the same writer).
        live = _background._writer_pool().submit(spillfs.save, sd, tmp_path / "live.pt")
        for v in sd.values():
            v.mul_(-1).add_(3)  # in place, as an optimizer step
        held.release()
        future.result(timeout=60)
        live.result(timeout=60)
    assert_same(at_call, torch.load(tmp_path / "snap.pt"))
    assert_same(sd, torch.load(tmp_path / "live.pt"))  # ...so the test above can fail
    assert not torch.equal(sd["w0"], at_call["w0"])


def test_errors_surface_from_result_as_a_synchronous_save_raises(tmp_path):
    missing = tmp_path / "no-such-dir" / "ckpt.pt"
    with pytest.raises(FileNotFoundError) as sync:
        spillfs.save(_state(), missing)
    future = spillfs.save(_state(), missing, background=True)
    with pytest.raises(FileNotFoundError) as bg:
        future.result(timeout=60)
    assert bg.value.filename == sync.value.filename == str(missing)
    assert str(bg.value) == str(sync.value)
    # what pickle refuses: the same exception, nothing written
    bad = {"w": torch.ones(3), "f": lambda: 0}
    with pytest.raises(Exception) as sync:
        spillfs.save(bad, tmp_path / "bad.pt")
    future = spillfs.save(bad, tmp_path / "bad.pt", background=True)
    with pytest.raises(type(sync.value)) as bg:
        future.result(timeout=60)
    assert str(bg.value) == str(sync.value)
    assert os.listdir(tmp_path) == []
    # wait() raises the first error of the saves it waited for
    with _HeldWriter() as held:
        first = spillfs.save(_state(), missing, background=True)
        spillfs.save(_state(), tmp_path / "ok.pt", background=True)
        threading.Timer(0.2, held.go.set).start()  # while wait() waits for both
        with pytest.raises(FileNotFoundError):
            spillfs.checkpoint.wait(timeout=60)
    assert first.done() and os.listdir(tmp_path) == ["ok.pt"]
    with pytest.raises(ValueError, match="needs a path"):
        spillfs.save(_state(), open(tmp_path / "f.pt", "wb"), background=True)


def test_host_memory_is_bounded_and_saves_are_persisted_in_call_order(tmp_path):
    one = 4 * MIB  # a snapshot of _state(): 4 tensors of 1 MiB
    bound = one + one // 2  # one snapshot fits, two do not
    path = tmp_path / "ckpt.pt"
    states = [_state(seed) for seed in range(4)]
    futures, waited, peak = [], [], []

    def saver():  # as a training loop: each save's call returns before the next
        for sd in states:
            futures.append(spillfs.save(sd, path, background=True, max_host_bytes=bound))
            waited.append(futures[-1].done() or None)
            peak.append(_background._pending_bytes)

    with _HeldWriter() as held:
        thread = threading.Thread(target=saver)
        thread.start()
        deadline = time.monotonic() + 10
        while not futures and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        # the first snapshot is taken; the second would pass the bound: its call waits
        assert len(futures) == 1 and _background._pending_bytes == one
        held.release()
        thread.join(60)
    assert not thread.is_alive() and len(futures) == 4
    reports = [f.result(timeout=60) for f in futures]
    assert max(peak) <= bound
    assert reports[1].seconds["host_wait"] > 0.2
    assert_same(states[-1], torch.load(path))  # the last call's values: saves in call order
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    # a snapshot over the bound alone goes once nothing is pending
    big = spillfs.save(_state(9, n=8), tmp_path / "big.pt", background=True, max_host_bytes=one)
    assert big.result(timeout=60).storage_bytes == 2 * one
    assert_same(_state(9, n=8), torch.load(tmp_path / "big.pt"))


def test_wait_waits_for_every_pending_save(tmp_path):
    with _HeldWriter():
        futures = [spillfs.save(_state(i), tmp_path / f"s{i}.pt", background=True) for i in range(3)]
        assert not any(f.done() for f in futures)
    spillfs.checkpoint.wait(timeout=60)
    assert all(f.done() and f.exception() is None for f in futures)
    for i in range(3):
        assert_same(_state(i), spillfs.load(tmp_path / f"s{i}.pt"))


def test_a_forked_child_saves_in_the_background_while_the_parent_has_saves_pending(tmp_path):
    sd = _state(4)
    with _HeldWriter():
        parents = spillfs.save(sd, tmp_path / "parent.pt", background=True)  # pending at the fork
        pid = os.fork()
        if pid == 0:  # the child: the parent's writer thread is not here
            code = 1
            try:
                torch.set_num_threads(1)  # as DataLoader's workers: OpenMP's pool does not survive a fork
                spillfs.save(sd, tmp_path / "child.pt", background=True).result(timeout=30)
                spillfs.checkpoint.wait(timeout=30)
                code = 0 if torch.equal(torch.load(tmp_path / "child.pt")["w0"], sd["w0"]) else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while (reaped := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if reaped[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child's background save did not finish in 60 s")
    assert os.waitstatus_to_exitcode(reaped[1]) == 0, "the child's background save failed or wrote other values"
    parents.result(timeout=60)
    assert_same(sd, torch.load(tmp_path / "parent.pt"))


def test_a_second_background_save_is_deduplicated(mount):
    if _native.segment_io() is None:
        pytest.skip("dedup needs libspillfs_client with the segment I/O")
    sd = _state(5, n=8)  # 8 MiB
    r1 = spillfs.save(sd, os.path.join(mount, "bg1.pt"), background=True).result(timeout=60)
    assert r1.backend == "native"
    before = _physical_bytes(mount)
    r2 = spillfs.save(sd, os.path.join(mount, "bg2.pt"), background=True).result(timeout=60)
    assert r2.dedup and r2.bytes_shared >= 8 * MIB - 8 * 256 * KIB, r2
    assert r2.bytes_written < 1 * MIB, r2
    if before is not None:
        assert _physical_bytes(mount) - before < 1 * MIB
    for name in ("bg1.pt", "bg2.pt"):
        assert_same(sd, torch.load(os.path.join(mount, name)))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA snapshot: needs a GPU (none here)")


@needs_cuda
def test_cuda_tensors_hold_the_values_at_the_call(tmp_path):
    sd = {k: v.cuda() for k, v in _state(3).items()}
    sd["small"] = torch.arange(10.0, device="cuda")
    at_call = {k: v.cpu() for k, v in sd.items()}
    torch.cuda._sleep(10_000_000)  # work queued on the current stream before the save...
    for v in sd.values():
        v.add_(1)  # ...and an update ordered after it: the snapshot must see it
    at_call = {k: v + 1 for k, v in at_call.items()}
    future = spillfs.save(sd, tmp_path / "cuda.pt", background=True)
    for v in sd.values():
        v.mul_(-1)  # right after the return, in place
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for v in sd.values():
            v.add_(5)
    future.result(timeout=60)
    got = torch.load(tmp_path / "cuda.pt")
    assert all(v.is_cuda for v in got.values())
    assert_same(at_call, {k: v.cpu() for k, v in got.items()})


@needs_cuda
def test_cuda_background_file_is_what_a_synchronous_save_writes(tmp_path):
    obj = {"w": torch.randn(300_000, device="cuda"), "b": torch.randn(7, device="cuda"), "c": torch.ones(5)}
    spillfs.save(obj, tmp_path / "sync.pt")
    spillfs.save(obj, tmp_path / "bg.pt", background=True).result(timeout=60)
    assert_same(torch.load(tmp_path / "sync.pt", map_location="cpu"), torch.load(tmp_path / "bg.pt",
                                                                                 map_location="cpu"))
    assert pickle.dumps(torch.load(tmp_path / "bg.pt")["w"].device) == pickle.dumps(obj["w"].device)
