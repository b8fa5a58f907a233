"""spillfs.save / spillfs.load from and to CUDA memory, and the GPU's dedup hashes.

Every test here needs a CUDA device and skips, saying so, where torch sees
none (the CI machines); the GPU machine runs them (docs/results.md names the
run). The same round trips as test_serialization.py, with the storages on the
GPU: spillfs.save -> torch.load, torch.save -> spillfs.load, each -> itself,
on a plain directory and on a spillfs mount, through the native segment I/O
and through the Python fallback.
"""

import ctypes
import os

import pytest

torch = pytest.importorskip("torch")
import spillfs  # noqa: E402
from spillfs import _native  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")

UNIT = 256 << 10


def _dtypes():
    names = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
             "complex64", "complex128"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _random(shape, dtype, device="cuda", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    if dtype == torch.bool:
        return (torch.rand(shape, generator=g) > 0.5).to(device)
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype).to(device)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).to(device)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype).to(device)


def _state():
    """A mix a checkpoint has: big and small storages of every dtype, views
    sharing one storage, a non-contiguous view, 0-d and empty tensors."""
    base = _random((1 << 20) + 37, torch.float32, seed=1)  # ~4 MiB, not a whole number of units
    state = {f"t_{str(d).split('.')[-1]}": _random((257, 33), d, seed=i) for i, d in enumerate(_dtypes())}
    state.update({
        "big": _random((3 << 20,), torch.bfloat16, seed=2),  # 6 MiB
        "view_a": base[: 1 << 19],
        "view_b": base[1 << 19:],
        "transposed": _random((512, 300), torch.float32, seed=3).t(),
        "scalar": torch.tensor(3.5, device="cuda"),
        "empty": torch.empty(0, 7, device="cuda"),
        "nested": [{"x": _random((1000,), torch.int64, seed=4)}, (torch.arange(10, device="cuda"),)],
    })
    return state


def _bytes(t):
    """The tensor's elements as bytes (bitwise comparison: NaNs and -0.0 included)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.device == b.device, (a.device, b.device)
        assert torch.equal(_bytes(a), _bytes(b))
        return
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
        return
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a == b


def _backends():
    out = ["posix"]
    if _native.segment_io() is not None:
        out.append("native")
    return out


@pytest.fixture(params=["plain", "mount"])
def directory(request, tmp_path):
    if request.param == "plain":
        return str(tmp_path)
    return request.getfixturevalue("mount")


@pytest.mark.parametrize("backend", _backends())
def test_spillfs_save_of_cuda_tensors_is_read_by_torch_load(directory, backend):
    state = _state()
    path = os.path.join(directory, f"cuda-{backend}.pt")
    report = spillfs.save(state, path, backend=backend)
    assert report.device_bytes > 0
    _same(state, torch.load(path, map_location="cuda"))
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["big"].device.type == "cpu"
    assert torch.equal(on_cpu["big"], state["big"].cpu())
    assert on_cpu["view_a"].storage().data_ptr() == on_cpu["view_b"].storage().data_ptr()  # saved once


@pytest.mark.parametrize("backend", _backends())
def test_spillfs_load_of_torch_save_to_cuda(directory, backend):
    state = _state()
    path = os.path.join(directory, f"torch-{backend}.pt")
    torch.save(state, path)
    report = spillfs.IOReport()
    _same(state, spillfs.load(path, map_location="cuda", backend=backend, report=report))
    assert report.device_bytes > 0
    cpu_state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    loaded = spillfs.load(path, map_location="cpu", backend=backend)
    for k, v in cpu_state.items():
        assert torch.equal(loaded[k].cpu(), v.cpu()), k


@pytest.mark.parametrize("backend", _backends())
def test_spillfs_save_then_spillfs_load_on_cuda(directory, backend):
    state = _state()
    path = os.path.join(directory, f"self-{backend}.pt")
    spillfs.save(state, path, backend=backend)
    _same(state, spillfs.load(path, map_location="cuda", backend=backend))
    _same({k: v for k, v in state.items() if k == "big"},
          {"big": spillfs.load(path, map_location={"cuda:0": "cuda:0"}, backend=backend)["big"]})


def test_gpu_unit_hashes_equal_the_cpus():
    lib = _native.segment_io()
    if lib is None:
        pytest.skip("libspillfs_client with the segment I/O is not built")
    for length in (UNIT, 7 * UNIT, 7 * UNIT + 4096 + 3):
        data = torch.randint(0, 256, (length,), dtype=torch.uint8, device="cuda")
        units = length // UNIT
        on_gpu = (ctypes.c_uint64 * (2 * units))()
        on_cpu = (ctypes.c_uint64 * (2 * units))()
        host = data.cpu()
        stream = torch.cuda.current_stream().cuda_stream
        assert lib.spill_hash_units(data.data_ptr(), length, data.device.index, stream, on_gpu) >= 0, _native.last_error()
        assert lib.spill_hash_units(host.data_ptr(), length, -1, 0, on_cpu) >= 0, _native.last_error()
        assert list(on_gpu) == list(on_cpu), length


def test_gpu_unit_hashes_of_many_buffers_in_one_call_equal_the_cpus():
    from spillfs import _io
    if _native.segment_io() is None:
        pytest.skip("libspillfs_client with the segment I/O is not built")
    # odd lengths, one with no whole unit, one buffer at an offset into another's storage
    base = torch.randint(0, 256, (9 * UNIT + 77,), dtype=torch.uint8, device="cuda")
    buffers = [base[:3 * UNIT + 5], base[3 * UNIT + 5:3 * UNIT + 4101], base[4 * UNIT:],
               torch.randint(0, 256, (2 * UNIT,), dtype=torch.uint8, device="cuda")]
    stream = torch.cuda.current_stream().cuda_stream
    many = _io.hash_units_many([(b.data_ptr(), b.numel()) for b in buffers], 0, stream)
    assert [len(h) for h in many] == [6, 0, 10, 4]
    for b, h in zip(buffers, many):
        host = b.cpu()
        assert list(h) == list(_io.hash_units(host.data_ptr(), host.numel(), -1)), b.numel()
        assert list(h) == list(_io.hash_units(b.data_ptr(), b.numel(), 0, stream)), b.numel()


def test_second_save_of_a_cuda_state_dict_shares_what_did_not_change(mount):
    if _native.segment_io() is None:
        pytest.skip("libspillfs_client with the segment I/O is not built")
    state = {f"w{i}": _random((UNIT // 2 * 8,), torch.bfloat16, seed=10 + i) for i in range(8)}  # 8 x 2 MiB
    first = spillfs.save(state, os.path.join(mount, "step1.pt"))
    state["w3"].add_(1)
    second = spillfs.save(state, os.path.join(mount, "step2.pt"))
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert first.bytes_shared < total / 2
    assert second.bytes_shared >= total - 2 * (UNIT * 8), (second.bytes_shared, total)
    _same(state, spillfs.load(os.path.join(mount, "step2.pt"), map_location="cuda"))


def test_a_cuda_save_hashes_on_the_gpu_what_the_cpu_would(mount):
    """A direct-path save of CUDA storages computes their block checksums and unit hashes on the
    GPU (the setting device_hashes, on by default): a load verifies every block against those
    checksums, and the same bytes saved from the CPU, hashed there, share every unit the GPU
    hashed (its blobs are keyed by the GPU's hashes)."""
    if _native.segment_io() is None:
        pytest.skip("libspillfs_client with the segment I/O is not built")
    t = _random((UNIT * 8 + 123,), torch.float32, seed=21)  # 32 whole units and a partial one
    r = spillfs.save({"t": t}, os.path.join(mount, "gpu.pt"))
    assert r.io_path == "direct_path", r.io_path
    _same({"t": t}, spillfs.load(os.path.join(mount, "gpu.pt"), map_location="cuda"))
    on_cpu = spillfs.save({"t": t.cpu()}, os.path.join(mount, "cpu.pt"))
    assert on_cpu.bytes_shared == 32 * UNIT, on_cpu.bytes_shared
