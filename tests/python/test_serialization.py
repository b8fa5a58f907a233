"""spillfs.save / spillfs.load against torch.save / torch.load (CPU torch).

Run: .venv/bin/python -m pytest -q tests/python/test_serialization.py
Most tests run anywhere (a temporary directory, Python I/O or the library);
those on a spillfs mount use conftest.py's `mount` fixture (root, /dev/fuse,
SPILLFS_BIN) and skip without it; ENOSPC needs root to mount a small tmpfs.
SPILLFS_TEST_LARGE=1 adds a save and load of a 4.1 GiB tensor (about 9 GB
of memory; minutes).
"""

import collections
import errno
import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")

import spillfs  # noqa: E402  (conftest.py puts clients/python on sys.path)
from spillfs import _io, _native  # noqa: E402
from spillfs.checkpoint import _zipfile  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


def _bits(t):
    """Everything bit-for-bit equality of a loaded tensor means."""
    if t.is_quantized:
        q = [t.qscheme()]
        if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            q += [t.q_scale(), t.q_zero_point()]
        else:
            q += [_bits(t.q_per_channel_scales()), _bits(t.q_per_channel_zero_points()), t.q_per_channel_axis()]
        return (t.dtype, tuple(t.shape), t.stride(), _bits(t.int_repr()), tuple(q))
    data = t.detach().reshape(-1).contiguous()
    raw = bytes(data.view(torch.uint8).numpy()) if data.dtype != torch.uint8 else bytes(data.numpy())
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad, raw)


def assert_same(a, b):
    """Nested containers of tensors equal bit for bit (storage sharing aside)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert _bits(a) == _bits(b)
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


QUANTIZED = (torch.quint8, torch.qint8, torch.qint32, torch.quint4x2)


def make(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in QUANTIZED:
        return torch.quantize_per_tensor(torch.randn(shape, generator=g), 0.05, 2 if dtype != torch.qint8 else 0,
                                         dtype)
    if dtype == torch.complex32:
        return torch.randn(*shape, 2, generator=g).half().view(torch.complex32).reshape(shape)
    if dtype.is_complex or dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64 if dtype.is_floating_point else torch.complex128)
        t = t.to(dtype)
        if dtype.is_floating_point and t.numel() >= 4:  # bit patterns that == would hide
            flat = t.view(-1)
            flat[:4] = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf")]).to(dtype)
        return t
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=dtype)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
          torch.complex32, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
          torch.quint8, torch.qint8, torch.qint32, torch.quint4x2]


def sample(dtype):
    """Every shape that matters, of one dtype, sharing storages as torch does."""
    big = make(dtype, (300, 500), 1)  # >= 256 KiB for most dtypes
    small = make(dtype, (7, 3), 2)
    out = {"big": big, "small": small, "scalar": make(dtype, (), 3), "empty": make(dtype, (0,), 4),
           "empty2d": make(dtype, (0, 5), 5)}
    if dtype not in QUANTIZED:
        out["transposed"] = big.t()             # a view: same storage
        out["strided"] = big[::3, 1::7]
        out["row"] = big[5]
        out["noncontig_copy"] = make(dtype, (40, 30), 6).t()
    return out


def _save(fn, obj, path):
    if fn == "spillfs":
        spillfs.save(obj, path)
    else:
        torch.save(obj, path)


def _load(fn, path, **kw):
    return spillfs.load(path, **kw) if fn == "spillfs" else torch.load(path, **kw)


DIRECTIONS = [("spillfs", "torch"), ("torch", "spillfs"), ("spillfs", "spillfs"), ("torch", "torch")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("saver,loader", DIRECTIONS, ids=lambda d: d)
def test_round_trip_every_dtype(tmp_path, dtype, saver, loader):
    obj = sample(dtype)
    path = tmp_path / "x.pt"
    try:
        torch.save(obj, io.BytesIO())
    except Exception as e:  # torch cannot save it (complex32 in 1.13): nor can we, the same way
        with pytest.raises(type(e)) as ours:
            spillfs.save(obj, path)
        assert str(ours.value) == str(e) and not path.exists()
        pytest.skip(f"torch {torch.__version__} cannot save {dtype}: {e!r}")
    _save(saver, obj, path)
    back = _load(loader, path)
    assert_same(obj, back)
    if "transposed" in back:  # views still share one storage
        back["big"].view(-1)[0:1].zero_() if dtype != torch.bool else back["big"].view(-1)[0:1].fill_(True)
        assert _bits(back["transposed"]) == _bits(back["big"].t())


def test_the_pickle_is_torch_saves_byte_for_byte(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.BatchNorm1d(40))
    obj = {"model": model.state_dict(), "t": sample(torch.float16), "q": sample(torch.qint8), "n": [1, "x"]}
    torch.save(obj, tmp_path / "x.pt")
    spillfs.save(obj, tmp_path / "y.pt")
    with zipfile.ZipFile(tmp_path / "x.pt") as x, zipfile.ZipFile(tmp_path / "y.pt") as y:
        assert x.read("x/data.pkl") == y.read("y/data.pkl")
        theirs = {n[2:]: x.read(n) for n in x.namelist()}
        ours = {n[2:]: y.read(n) for n in y.namelist()}
    theirs.pop("byteorder", None)
    # torch 2.x adds records of its own (.data/serialization_id, .format_version,
    # .storage_alignment) that torch.load of any version does without
    theirs = {name: data for name, data in theirs.items() if not name.startswith(".")}
    assert ours.pop("byteorder") == b"little"
    assert theirs == ours  # every record: the storages and the version


def test_views_share_one_storage_saved_once(tmp_path):
    base = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    views = [base, base[10:], base.view(1024, 1024).t(), base[::2]]
    spillfs.save(views, tmp_path / "v.pt")
    size = os.path.getsize(tmp_path / "v.pt")
    assert 4 * MIB <= size < 4 * MIB + 512 * KIB
    loaded = spillfs.load(tmp_path / "v.pt")
    loaded[1][0] = -1
    assert loaded[0][10] == -1 and loaded[2][10, 0] == -1
    with zipfile.ZipFile(tmp_path / "v.pt") as z:
        assert sum(1 for n in z.namelist() if "/data/" in n) == 1


def test_nested_containers_module_and_optimizer_state(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.BatchNorm1d(400), torch.nn.Linear(400, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 300)).sum().backward()
    opt.step()
    obj = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 7, "names": ["a", ("b", 3.5)],
           "nested": {"x": [torch.ones(2), {"y": torch.zeros(3, dtype=torch.int64)}]}, "none": None}
    for saver, loader in DIRECTIONS:
        _save(saver, obj, tmp_path / "m.pt")
        back = _load(loader, tmp_path / "m.pt")
        assert isinstance(back["model"], collections.OrderedDict)
        assert_same(obj, back)
    model2 = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.BatchNorm1d(400), torch.nn.Linear(400, 10))
    model2.load_state_dict(spillfs.load(tmp_path / "m.pt")["model"])
    opt2 = torch.optim.Adam(model2.parameters())
    opt2.load_state_dict(spillfs.load(tmp_path / "m.pt")["opt"])


def _data_offsets(path):
    """{name: (data offset, size)} from the central directory and local headers."""
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset)
            head = f.read(30)
            assert head[:4] == b"PK\x03\x04"
            n, m = struct.unpack("<HH", head[26:30])
            out[info.filename] = (info.header_offset + 30 + n + m, info.file_size)
    return out


def test_big_storages_are_256k_aligned_small_ones_64(tmp_path):
    obj = [torch.randn(n) for n in (10, 65536, 65535, 100000, 3, 70000, 1 << 20, 5)]
    spillfs.save(obj, tmp_path / "a.pt")
    offsets = _data_offsets(tmp_path / "a.pt")
    storages = {name: v for name, v in offsets.items() if "/data/" in name}
    assert len(storages) == len(obj)
    for name, (offset, size) in storages.items():
        assert offset % (256 * KIB if size >= 256 * KIB else 64) == 0, (name, offset, size)
    with zipfile.ZipFile(tmp_path / "a.pt") as z:
        assert z.testzip() is None  # real CRC-32s
        assert z.namelist()[0] == "a/data.pkl" and z.namelist()[-1] == "a/version"
        assert z.read("a/version") == b"3\n" and z.read("a/byteorder") == b"little"
    # padding is at most 256 KiB a big storage (small ones fill it where they fit)
    bigs = sum(1 for t in obj if t.numel() * 4 >= 256 * KIB)
    assert os.path.getsize(tmp_path / "a.pt") < sum(t.numel() * 4 for t in obj) + bigs * 256 * KIB


def test_padding_is_a_hole(tmp_path):
    """Storages of whole 256 KiB units leave most of a unit before the next one's
    data for its header: zeros, not written (the file's blocks are about the data's)."""
    obj = {f"w{i}": torch.randn(1 << 20) for i in range(16)}  # 16 x 4 MiB
    spillfs.save(obj, tmp_path / "h.pt", backend="posix")
    st = os.stat(tmp_path / "h.pt")
    assert st.st_size > 64 * MIB + 15 * 200 * KIB  # a unit of padding a storage ...
    assert st.st_blocks * 512 < 64 * MIB + 256 * KIB  # ... that takes no space
    assert_same(obj, torch.load(tmp_path / "h.pt"))


def test_records_without_crc32_are_read_by_torch(tmp_path):
    """crc32=False writes 0 for every CRC-32 (as CUDA storages moved by the
    library get by default): torch.load does not check them, zipfile does."""
    obj = {"a": torch.randn(300000), "b": torch.arange(7)}
    r = spillfs.save(obj, tmp_path / "n.pt", crc32=False)
    assert r.crc32_skipped == 5  # data.pkl, byteorder, two storages, version
    assert_same(obj, torch.load(tmp_path / "n.pt"))
    assert_same(obj, spillfs.load(tmp_path / "n.pt"))
    with zipfile.ZipFile(tmp_path / "n.pt") as z:
        assert z.testzip() is not None
    r = spillfs.save(obj, tmp_path / "y.pt", crc32=True)
    assert r.crc32_skipped == 0
    with zipfile.ZipFile(tmp_path / "y.pt") as z:
        assert z.testzip() is None


def test_file_objects_and_legacy_format(tmp_path):
    obj = {"w": torch.randn(100, 1000), "b": torch.arange(5)}
    buf = io.BytesIO()
    report = spillfs.save(obj, buf)
    assert report.backend == "stream" and report.file_bytes == len(buf.getvalue())
    buf.seek(0)
    assert_same(obj, torch.load(buf))
    buf.seek(0)
    assert_same(obj, spillfs.load(buf))
    with open(tmp_path / "f.pt", "wb") as f:
        f.write(b"prefix")  # a file object positioned past the start
        spillfs.save(obj, f)
    with open(tmp_path / "f.pt", "rb") as f:
        f.seek(6)
        assert_same(obj, spillfs.load(f))
    torch.save(obj, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    report = spillfs.IOReport()
    assert_same(obj, spillfs.load(tmp_path / "old.pt", report=report))
    assert report.backend == "torch"
    spillfs.save(obj, tmp_path / "old2.pt", _use_new_zipfile_serialization=False)
    assert_same(obj, torch.load(tmp_path / "old2.pt"))


def test_reports(tmp_path):
    obj = {"a": torch.randn(1 << 20), "b": torch.randn(10)}
    r = spillfs.save(obj, tmp_path / "r.pt")
    assert r is spillfs.last_report() and r.op == "save" and r.storages == 2
    assert r.storage_bytes == 4 * ((1 << 20) + 10)
    assert r.storage_bytes <= r.bytes_written <= r.file_bytes == os.path.getsize(tmp_path / "r.pt")
    assert r.bytes_shared == 0 and r.crc32_skipped == 0
    assert {"pickle", "write", "sync", "rename", "total"} <= set(r.seconds)
    r2 = spillfs.IOReport()
    spillfs.load(tmp_path / "r.pt", report=r2)
    assert r2 is spillfs.last_report() and r2.op == "load" and r2.storage_bytes == r.storage_bytes
    assert r2.bytes_read >= r2.storage_bytes and r2.gbps() > 0
    assert r2.as_dict()["seconds"]["total"] > 0


# -- map_location, weights_only ------------------------------------------------

class Custom:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Custom) and self.v == other.v


def test_map_location_forms(tmp_path):
    obj = {"a": torch.randn(70000), "b": torch.randn(3)}
    spillfs.save(obj, tmp_path / "m.pt")
    seen = []

    def to_cpu(storage, location):
        seen.append(location)
        return storage

    for m in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, to_cpu, lambda s, loc: None, None):
        assert_same(obj, spillfs.load(tmp_path / "m.pt", map_location=m))
    assert seen == ["cpu", "cpu"]


def test_cuda_locations_without_cuda_raise_what_torch_raises(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    obj = {"a": torch.randn(70000), "b": torch.randn(3)}
    real_tag = torch.serialization.location_tag
    monkeypatch.setattr(torch.serialization, "location_tag", lambda s: "cuda:0")  # a file saved on a GPU
    spillfs.save(obj, tmp_path / "g.pt")
    monkeypatch.setattr(torch.serialization, "location_tag", real_tag)
    for m in (None, "cuda:1", torch.device("cuda"), {"cuda:0": "cuda:0"}):
        with pytest.raises(RuntimeError) as theirs:
            torch.load(tmp_path / "g.pt", map_location=m)
        with pytest.raises(RuntimeError) as ours:
            spillfs.load(tmp_path / "g.pt", map_location=m)
        assert str(theirs.value) in str(ours.value)
    for m in ({"cuda:0": "cpu"}, "cpu", lambda s, loc: s):
        assert_same(obj, spillfs.load(tmp_path / "g.pt", map_location=m))


def test_weights_only(tmp_path, monkeypatch):
    spillfs.save({"w": torch.randn(5), "n": 3}, tmp_path / "ok.pt")
    assert spillfs.load(tmp_path / "ok.pt", weights_only=True)["n"] == 3
    spillfs.save({"c": Custom(4), "w": torch.ones(2)}, tmp_path / "custom.pt")
    with pytest.raises(pickle.UnpicklingError) as e:
        spillfs.load(tmp_path / "custom.pt", weights_only=True)
    assert "custom.pt" in str(e.value) and "Custom" in str(e.value)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "custom.pt", weights_only=True)
    # the default is the installed torch's (False in 1.13, True from 2.6)
    default = __import__("inspect").signature(torch.load).parameters["weights_only"].default
    if default is False:
        assert spillfs.load(tmp_path / "custom.pt")["c"] == Custom(4)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(pickle.UnpicklingError):
        spillfs.load(tmp_path / "custom.pt")
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        spillfs.load(tmp_path / "ok.pt", pickle_module=pickle, weights_only=True)



def test_torch_load_of_a_save_under_the_weights_only_default(tmp_path):
    """torch 2.6 made weights_only=True the default: a state_dict from spillfs.save loads with it."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 2))
    state = {"model": model.state_dict(), "step": 7, "lr": 1e-3, "names": ["a", "b"]}
    spillfs.save(state, tmp_path / "sd.pt")
    assert_same(state, torch.load(tmp_path / "sd.pt", weights_only=True))
    default = __import__("inspect").signature(torch.load).parameters["weights_only"].default
    if default is None:  # torch >= 2.6: None means True unless an env var says otherwise
        assert_same(state, torch.load(tmp_path / "sd.pt"))


@pytest.mark.skipif("mmap" not in __import__("inspect").signature(torch.load).parameters,
                    reason=f"torch.load(mmap=True) needs torch >= 2.1 (this is {torch.__version__})")
@pytest.mark.parametrize("loader", ["torch", "spillfs"])
def test_mmap_load_of_a_save_maps_the_file(tmp_path, loader):
    """torch.load(mmap=True) (torch >= 2.1) maps the file and takes each storage where its record
    lies; spillfs.save places big storages' records on page boundaries, which mapping wants."""
    obj = {"big": torch.randn(300_000), "small": torch.arange(5), "half": torch.randn(1000).half()}
    path = tmp_path / "m.pt"
    spillfs.save(obj, path)
    load = torch.load if loader == "torch" else spillfs.load
    got = load(path, mmap=True, weights_only=True)
    assert_same(obj, got)
    with open(path, "rb") as f:
        raw = f.read()
    at = raw.find(obj["big"].numpy().tobytes())  # the big storage's record starts on a page
    assert at > 0 and at % 4096 == 0, at


# -- bad input: clear errors, nothing lost ---------------------------------------

def test_truncated_and_non_torch_files_are_clear_errors(tmp_path):
    path = tmp_path / "good.pt"
    spillfs.save({"a": torch.randn(300000), "b": torch.randn(10)}, path)
    data = path.read_bytes()
    for cut in (len(data) - 10, len(data) // 2, 100, 30):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(RuntimeError) as e:
            spillfs.load(bad)
        assert str(bad) in str(e.value) and "central directory" in str(e.value)
        with pytest.raises(RuntimeError):
            torch.load(bad)
    text = tmp_path / "text.pt"
    text.write_bytes(b"hello, this is not a checkpoint\n")
    with pytest.raises(pickle.UnpicklingError, match="text.pt"):
        spillfs.load(text)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(EOFError, match="empty.pt"):
        spillfs.load(empty)
    with pytest.raises(FileNotFoundError):
        spillfs.load(tmp_path / "missing.pt")
    # a record shorter than its storage: an error, never a garbage tensor
    small = tmp_path / "short.pt"
    spillfs.save(torch.randn(1000), small)
    with zipfile.ZipFile(small) as z:
        entries = {i.filename: i for i in z.infolist()}
    pkl = bytearray(small.read_bytes())
    name = [n for n in entries if n.endswith("data.pkl")][0]
    with zipfile.ZipFile(small) as z:
        body = z.read(name)
    at = pkl.find(body)
    patched = body.replace(b"M\xe8\x03", b"M\xe9\x03")  # numel 1000 -> 1001 (BININT2)
    assert patched != body
    pkl[at:at + len(body)] = patched
    small.write_bytes(bytes(pkl))
    with pytest.raises(RuntimeError, match="short.pt"):
        spillfs.load(small)


def test_objects_torch_save_refuses_raise_the_same_and_write_nothing(tmp_path):
    t = torch.arange(10.0)
    cases = [lambda x: x, [t, t.view(torch.int32)]]
    for i, obj in enumerate(cases):
        with pytest.raises(Exception) as theirs:
            torch.save(obj, io.BytesIO())
        with pytest.raises(type(theirs.value)) as ours:
            spillfs.save(obj, tmp_path / f"r{i}.pt")
        assert str(ours.value) == str(theirs.value)
        assert os.listdir(tmp_path) == []
    with pytest.raises(AttributeError):
        spillfs.save(t, 42)


def test_an_interrupted_save_leaves_no_file_and_the_old_one_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    old = {"a": torch.randn(1 << 20)}
    spillfs.save(old, path)
    calls = []
    real = _io.PosixFile._write_one

    def failing(self, ptr, length, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of the data
        return real(self, ptr, length, offset)

    monkeypatch.setattr(_io.PosixFile, "_write_one", failing)
    with pytest.raises(KeyboardInterrupt):
        spillfs.save({"a": torch.randn(4 << 20)}, path, backend="posix")
    monkeypatch.setattr(_io.PosixFile, "_write_one", real)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    assert_same(old, spillfs.load(path))
    with pytest.raises(KeyboardInterrupt):
        monkeypatch.setattr(_io.PosixFile, "_write_one", failing)
        calls.clear()
        spillfs.save({"a": torch.randn(4 << 20)}, tmp_path / "new.pt", backend="posix")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


@pytest.fixture
def small_tmpfs(tmp_path):
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("ENOSPC test: mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"ENOSPC test: mount -t tmpfs refused: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


@pytest.mark.parametrize("backend", ["auto", "posix"])
def test_a_full_disk_raises_enospc_and_keeps_the_old_file(small_tmpfs, backend):
    path = small_tmpfs / "ckpt.pt"
    old = {"a": torch.randn(256 * KIB)}  # 1 MiB
    spillfs.save(old, path, backend=backend)
    with pytest.raises(OSError) as e:
        spillfs.save({"a": torch.randn(3 * MIB)}, path, backend=backend)  # 12 MiB
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert os.listdir(small_tmpfs) == ["ckpt.pt"]
    assert_same(old, spillfs.load(path))
    assert_same(old, torch.load(path))


# -- the zip format ----------------------------------------------------------------

def test_zip64_offsets_beyond_4gib(tmp_path):
    """A 4.1 GiB record (a hole) before a small storage: the central directory
    needs ZIP64 sizes and offsets; torch, zipfile and spillfs read it."""
    small = torch.randn(70000)  # too big for the padding before data/0: it comes after
    pkl = io.BytesIO()
    pickler = pickle.Pickler(pkl, protocol=2)
    pickler.persistent_id = lambda o: (("storage", torch.FloatStorage, "1", "cpu", 70000)
                                       if isinstance(o, torch.storage.TypedStorage) else None)
    pickler.dump(small)
    records = [_zipfile.Record("z/data.pkl", len(pkl.getvalue()), payload=pkl.getvalue()),
               _zipfile.Record("z/data/0", (4 << 30) + (100 << 20), _zipfile.BIG_ALIGN),
               _zipfile.Record("z/data/1", 280000, payload=small.numpy().tobytes()),
               _zipfile.Record("z/version", 2, payload=b"3\n")]
    cd_offset = _zipfile.plan(records, first=records[0])
    assert records[2].offset > 0xFFFFFFFF
    path = tmp_path / "z.pt"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for r in records:
            if r.payload is not None:
                r.crc = __import__("zlib").crc32(r.payload)
            os.pwrite(fd, _zipfile.local_header(r) + (r.payload or b""), r.offset)
        os.pwrite(fd, _zipfile.central_directory(records, cd_offset), cd_offset)
    finally:
        os.close(fd)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("z/data/1")
        assert info.header_offset == records[2].offset and z.getinfo("z/data/0").file_size == records[1].size
        assert z.read("z/data/1") == records[2].payload
    assert torch.equal(torch.load(path), small)
    assert torch.equal(spillfs.load(path), small)


@pytest.mark.skipif(os.environ.get("SPILLFS_TEST_LARGE") != "1", reason="set SPILLFS_TEST_LARGE=1 (9 GB of memory)")
def test_a_storage_over_4gib(tmp_path):
    big = torch.empty((4 << 30) + (4 << 20), dtype=torch.uint8)
    big[::4096] = 7
    big[-5:] = 9
    spillfs.save({"big": big, "after": torch.arange(10)}, tmp_path / "big.pt")
    with zipfile.ZipFile(tmp_path / "big.pt") as z:
        assert z.getinfo("big/data/0").file_size == big.numel()
    back = torch.load(tmp_path / "big.pt")
    assert torch.equal(back["big"], big) and torch.equal(back["after"], torch.arange(10))
    del back
    back = spillfs.load(tmp_path / "big.pt")
    assert torch.equal(back["big"], big)


def test_crc32_combine_matches_zlib():
    import random
    import zlib
    rng = random.Random(5)
    for _ in range(20):
        a, b = rng.randbytes(rng.randrange(0, 3000)), rng.randbytes(rng.randrange(0, 3000))
        want = zlib.crc32(a + b)
        assert _zipfile.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == want
        assert _zipfile._crc32_combine_py(zlib.crc32(a), zlib.crc32(b), len(b)) == want


def test_crc32_combiner_of_a_fixed_length_matches_zlib():
    import random
    import zlib
    rng = random.Random(6)
    for length in (1, 4096, 256 * KIB):
        combine = _zipfile.crc32_combiner(length)
        for _ in range(5):
            a, b = rng.randbytes(rng.randrange(0, 3000)), rng.randbytes(length)
            assert combine(zlib.crc32(a), zlib.crc32(b)) == zlib.crc32(a + b)


def test_a_library_of_another_version_is_refused(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text('const char* spill_version(void) { return "9.9.9"; }\n')
    lib = tmp_path / "libfake.so"
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True).returncode:
        pytest.skip("no C compiler")
    code = ("import spillfs, sys\n"
            "try:\n    spillfs.load_library()\nexcept spillfs.LibraryVersionError as e:\n"
            "    print(e); sys.exit(3)\n")
    env = dict(os.environ, SPILLFS_CLIENT_LIB=str(lib),
               PYTHONPATH=os.path.dirname(os.path.dirname(spillfs.__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert "9.9.9" in r.stdout and spillfs.__version__ in r.stdout


# -- on a spillfs mount ------------------------------------------------------------

def test_on_a_spillfs_mount(mount):
    obj = sample(torch.bfloat16)
    obj["opt"] = {"m": torch.randn(100000), "step": 3}
    for saver, loader in DIRECTIONS:
        path = os.path.join(mount, f"{saver}-{loader}.pt")
        _save(saver, obj, path)
        assert_same(obj, _load(loader, path))
    assert [n for n in os.listdir(mount) if "spillfs-tmp" in n] == []


@pytest.mark.skipif("mmap" not in __import__("inspect").signature(torch.load).parameters,
                    reason=f"torch.load(mmap=True) needs torch >= 2.1 (this is {torch.__version__})")
def test_torch_load_mmap_of_a_save_through_the_mount(mount):
    """torch.load(mmap=True) maps a spillfs.save file through the mount (its
    big storages on page boundaries, dedup'd units among them) and reads
    what was saved, the tensors views of the mapping."""
    obj = {"big": torch.randn(300_000), "units": torch.randn(4, 256 * KIB // 4), "small": torch.arange(5),
           "half": torch.randn(1000).half(), "bf16": torch.randn(70_000).bfloat16()}
    path = os.path.join(mount, "mmap.pt")
    spillfs.save(obj, path)
    spillfs.save(obj, os.path.join(mount, "mmap-again.pt"))  # its units shared with the first's
    for name in ("mmap.pt", "mmap-again.pt"):
        got = torch.load(os.path.join(mount, name), mmap=True, weights_only=True)
        assert_same(obj, got)
        assert _mapped_from(got["big"].data_ptr()) == os.path.join(mount, name)  # a view of the mapping


def _mapped_from(address):
    """The file mapped at `address` in this process (/proc/self/maps), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 else None
    return None


def _stat(mount):
    """`spillfs stat --json` of the mount."""
    from conftest import SPILLFS_BIN
    import json
    out = subprocess.run([SPILLFS_BIN, "stat", "--json", mount], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def _physical_bytes(mount):
    stats = _stat(mount)
    return stats.get("used_bytes", stats.get("physical_bytes"))


def test_stat_counts_direct_path_writes_and_deduplicated_bytes(mount):
    """`spillfs stat` counts what the direct path wrote among the SSD's bytes written, and shows
    the bytes a second save stored as references instead."""
    if _native.segment_io() is None:
        pytest.skip("the direct path needs libspillfs_client with the segment I/O")
    sd = {f"w{i}": torch.randn(256 * KIB) for i in range(4)}  # 4 MiB
    before = _stat(mount)
    r1 = spillfs.save(sd, os.path.join(mount, "counted1.pt"))
    assert r1.io_path == "direct_path", r1
    mid = _stat(mount)
    assert mid["bytes_written_direct"] - before["bytes_written_direct"] >= 4 * MIB
    assert mid["bytes_written_ssd"] - before["bytes_written_ssd"] >= mid["bytes_written_direct"] - before[
        "bytes_written_direct"]
    r2 = spillfs.save(sd, os.path.join(mount, "counted2.pt"))
    after = _stat(mount)
    assert r2.bytes_shared >= 3 * MIB
    assert after["bytes_deduplicated"] - mid["bytes_deduplicated"] >= r2.bytes_shared
    assert after["bytes_written_direct"] - mid["bytes_written_direct"] < 2 * MIB


def test_unit_hashes_of_many_buffers_in_one_call():
    """hash_units_many: each buffer's hashes in order, as hash_units gives
    them (buffers with no whole unit, odd lengths); a bad device refused."""
    if _native.segment_io() is None:
        pytest.skip("needs libspillfs_client with the segment I/O")
    from spillfs import _io
    unit = _native.HASH_UNIT_BYTES
    base = torch.randint(0, 256, (5 * unit + 77,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    buffers = [base[:2 * unit + 5], base[2 * unit + 5:2 * unit + 4101], base[3 * unit:]]
    many = _io.hash_units_many([(b.data_ptr(), b.numel()) for b in buffers], -1)
    assert [len(h) for h in many] == [4, 0, 4]
    for b, h in zip(buffers, many):
        assert list(h) == list(_io.hash_units(b.data_ptr(), b.numel(), -1))
    assert many[0][:2] != many[2][:2]
    with pytest.raises(OSError):  # no CUDA device 99 (or no CUDA at all)
        _io.hash_units_many([(base.data_ptr(), unit)], 99)


def test_dedup_on_a_spillfs_mount(mount):
    if _native.segment_io() is None:
        pytest.skip("dedup needs libspillfs_client with the segment I/O")
    sd = {f"w{i}": torch.randn(256 * KIB) for i in range(8)}  # 8 MiB
    r1 = spillfs.save(sd, os.path.join(mount, "s1.pt"))
    assert r1.backend == "native"
    before = _physical_bytes(mount)
    r2 = spillfs.save(sd, os.path.join(mount, "s2.pt"))
    assert r2.dedup and r2.bytes_shared >= 8 * MIB - 8 * 256 * KIB
    sd["w3"] = torch.randn(256 * KIB)
    r3 = spillfs.save(sd, os.path.join(mount, "s3.pt"))
    assert 1 * MIB <= r3.bytes_written < 2 * MIB
    if before is not None:
        assert _physical_bytes(mount) - before < 3 * MIB
    for name in ("s2.pt", "s3.pt"):
        assert_same(sd if name == "s3.pt" else {**sd, "w3": spillfs.load(os.path.join(mount, "s1.pt"))["w3"]},
                    torch.load(os.path.join(mount, name)))
    r = spillfs.save(sd, os.path.join(mount, "s4.pt"), dedup=False)
    assert not r.dedup and r.bytes_shared == 0


def test_dedup_of_many_tensors_is_one_request_and_adds_the_changed_bytes(mount):
    """A state_dict of many tensors (whole units, units and a tail, small
    ones): each save asks the daemon once, whatever the number of storages;
    the second save, with a few tensors changed, adds about their bytes to
    the volume; the CRC-32s the second save took from the units' of the
    first are right (zipfile checks them)."""
    if _native.segment_io() is None:
        pytest.skip("dedup needs libspillfs_client with the segment I/O")
    gen = torch.Generator().manual_seed(23)
    sd = {}
    for i in range(16):
        sd[f"l{i}.w"] = torch.randn(256, 512, generator=gen)  # 512 KiB: two whole units
        sd[f"l{i}.u"] = torch.randn(1408, 256, generator=gen)  # 1.375 MiB: five units and a tail
        sd[f"l{i}.n"] = torch.randn(512, generator=gen)  # small: packed
    big = [t for t in sd.values() if t.numel() * 4 >= 256 * KIB]
    tails = sum(t.numel() * 4 % (256 * KIB) for t in big)
    r1 = spillfs.save(sd, os.path.join(mount, "many1.pt"))
    assert r1.dedup and r1.dedup_requests == 1, r1
    before = _physical_bytes(mount)
    changed = ("l0.w", "l3.u", "l7.u", "l9.w")
    for name in changed:
        sd[name].add_(1)
    r2 = spillfs.save(sd, os.path.join(mount, "many2.pt"))
    assert r2.dedup and r2.dedup_requests == 1, r2
    changed_bytes = sum(sd[name].numel() * 4 for name in changed)
    changed_units = sum(sd[name].numel() * 4 // (256 * KIB) for name in changed)
    all_units = sum(t.numel() * 4 // (256 * KIB) for t in big)
    assert r2.bytes_shared == (all_units - changed_units) * 256 * KIB
    assert r2.units_changed_in_place == changed_units  # written while the volume was asked about the rest
    assert changed_bytes <= r2.bytes_written < changed_bytes + tails + 64 * KIB + 16 * 4 * KIB * 3
    if before is not None:
        grown = _physical_bytes(mount) - before
        assert grown < changed_bytes + tails + 64 * KIB + 16 * 4 * KIB * 3 + 1 * MIB, grown
    for name in ("many1.pt", "many2.pt"):
        with zipfile.ZipFile(os.path.join(mount, name)) as z:
            assert z.testzip() is None, name
    assert_same(sd, torch.load(os.path.join(mount, "many2.pt")))
    # Unchanged: nothing but the glue is written, still one request.
    r3 = spillfs.save(sd, os.path.join(mount, "many3.pt"))
    assert r3.dedup_requests == 1 and r3.bytes_written < tails + 64 * KIB + 16 * 4 * KIB * 3
    with zipfile.ZipFile(os.path.join(mount, "many3.pt")) as z:
        assert z.testzip() is None


# -- the native path's logic, on a stand-in library --------------------------------

def test_dedup_writes_only_the_units_the_volume_lacks(tmp_path, monkeypatch):
    """With a Python stand-in for the segment I/O and the volume's dedup
    (fake_native.py): segments start 4 KiB-aligned, the second save of a
    state_dict with one tensor changed writes about that tensor, and every
    file reads back right under torch.load."""
    from fake_native import FakeSegmentLib
    fake = FakeSegmentLib()
    monkeypatch.setattr(_native, "segment_io", lambda: fake)
    sd = {f"w{i}": torch.randn(300_000) for i in range(6)}  # 1.2 MB each: units and a tail
    sd["small"] = torch.arange(10)
    sd["view"] = sd["w2"][7:]
    r1 = spillfs.save(sd, tmp_path / "s1.pt")
    assert r1.backend == "native" and r1.dedup and r1.bytes_shared == 0
    assert fake.dedup_calls == 1 and r1.dedup_requests == 1  # one request for all six storages
    assert_same(sd, torch.load(tmp_path / "s1.pt"))
    for ptr, length, offset, device in fake.segments_seen:
        assert offset % 4096 == 0
    before = fake.written
    r2 = spillfs.save(sd, tmp_path / "s2.pt")
    assert fake.dedup_calls == 2
    units = sum((t.numel() * 4) // (256 * KIB) for k, t in sd.items() if k.startswith("w"))
    assert r2.bytes_shared == units * 256 * KIB
    tails = sum((t.numel() * 4) % (256 * KIB) for k, t in sd.items() if k.startswith("w"))
    assert fake.written - before == r2.bytes_written
    assert tails <= r2.bytes_written < tails + 64 * KIB  # partial last units, headers and the pickle
    sd["w4"] += 1
    before, asked = fake.written, fake.units_asked
    r3 = spillfs.save(sd, tmp_path / "s3.pt")
    assert r3.units_changed_in_place == 4 and fake.units_asked - asked == units - 4  # w4's written unasked
    assert tails + 4 * 256 * KIB <= r3.bytes_written < tails + 4 * 256 * KIB + 64 * KIB
    assert fake.written - before == r3.bytes_written
    for name, want in (("s2.pt", None), ("s3.pt", sd)):
        back = torch.load(tmp_path / name)
        if want is not None:
            assert_same(want, back)
        with zipfile.ZipFile(tmp_path / name) as z:
            assert z.testzip() is None
    assert_same(sd, spillfs.load(tmp_path / "s3.pt"))
    r4 = spillfs.save(sd, tmp_path / "s4.pt", dedup=False)
    assert not r4.dedup and r4.bytes_shared == 0 and r4.bytes_written >= 6 * 1_200_000


def test_dedup_asks_about_storages_it_has_not_saved(tmp_path, monkeypatch):
    """Units are written without asking only where the same storage, still
    alive, changed since this process saved it: a tensor made anew (at the
    address of one freed, as the allocator likes) is asked about, so the
    volume shares what it holds of it."""
    from fake_native import FakeSegmentLib
    fake = FakeSegmentLib()
    monkeypatch.setattr(_native, "segment_io", lambda: fake)
    w = torch.randn(8 * 256 * KIB // 4, generator=torch.Generator().manual_seed(3))
    spillfs.save({"w": w}, tmp_path / "a.pt")
    del w
    w = torch.randn(8 * 256 * KIB // 4, generator=torch.Generator().manual_seed(3))  # the same bytes, anew
    asked = fake.units_asked
    r = spillfs.save({"w": w}, tmp_path / "b.pt")
    assert r.units_changed_in_place == 0 and fake.units_asked - asked == 8
    assert r.bytes_shared == 8 * 256 * KIB
    w[:256 * KIB // 4] += 1  # its first unit changes in place
    asked = fake.units_asked
    r = spillfs.save({"w": w}, tmp_path / "c.pt")
    assert r.units_changed_in_place == 1 and fake.units_asked - asked == 7
    assert r.bytes_shared == 7 * 256 * KIB
    assert_same({"w": w}, torch.load(tmp_path / "c.pt"))


def test_dedup_with_a_library_without_dedup_units(tmp_path, monkeypatch):
    """A library without spill_file_dedup_units: a dedup request per run of
    consecutive units (per storage), same result."""
    from fake_native import FakeSegmentLib
    fake = FakeSegmentLib()
    monkeypatch.setattr(_native, "segment_io", lambda: fake)
    monkeypatch.setattr(_io.NativeFile, "dedup_units_supported", property(lambda self: False))
    sd = {f"w{i}": torch.randn(300_000) for i in range(4)}
    spillfs.save(sd, tmp_path / "s1.pt")
    assert fake.dedup_calls == 4
    r2 = spillfs.save(sd, tmp_path / "s2.pt")
    assert fake.dedup_calls == 8 and r2.dedup_requests == 4
    assert r2.bytes_shared == 4 * (1_200_000 // (256 * KIB)) * 256 * KIB
    assert_same(sd, torch.load(tmp_path / "s2.pt"))


# -- a user who is not root ------------------------------------------------------

_NOT_ROOT_CHILD = r"""
import os, sys, warnings
import torch, spillfs
from spillfs import _native
_native.segment_io()  # the library loaded while the interpreter's files are still readable
getattr(torch.serialization, "get_crc32_options", lambda: None)()  # and torch's lazily imported config
# Become uid 65534 only now: the interpreter here lives where that user may not read (/root).
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
path = sys.argv[1]
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for device in devices:
        # 4 MiB: 16 units of 256 KiB, other bytes on each device
        t = torch.arange(1 << 20, dtype=torch.float32, device=device) + len(device)
        r1 = spillfs.save({"t": t}, path + device)
        r2 = spillfs.save({"t": t, "u": t[:1000] + 1}, path + device + ".2")  # the same units, and one more record
        back = spillfs.load(path + device + ".2", map_location=device)
        assert torch.equal(back["t"], t) and torch.equal(back["u"], t[:1000] + 1), device
        print("SAVE", device, r1.backend, r1.io_path, r1.bytes_shared, r2.io_path, r2.bytes_shared,
              r2.io_stats.get("io_bytes"))
for w in caught:
    if "spillfs" in str(w.message):
        print("WARNING", w.category.__name__, w.message)
"""


def test_a_user_who_is_not_root_gets_the_daemons_memory_io_with_dedup():
    """On a mount other users may use (allow_other), uid 65534 may not open the data area; its
    saves and loads go through the daemon's memory I/O (the bytes in a memfd shared with it), with
    dedup: a second save of the same tensor writes none of its units. No warning: nothing is lost."""
    import conftest
    reason = conftest.mount_unavailable()
    if reason:
        pytest.skip(f"spillfs mount: {reason}")
    if _native.segment_io() is None:
        pytest.skip("libspillfs_client with the segment I/O is not available (set SPILLFS_CLIENT_LIB)")
    lib = os.path.abspath(_native.library_path())
    import tempfile
    tmp = tempfile.mkdtemp(prefix="spillfs-notroot-")
    os.chmod(tmp, 0o755)
    volume, mnt = os.path.join(tmp, "vol"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    home = os.path.join(tmp, "home")
    os.mkdir(home)
    os.chown(home, 65534, 65534)
    subprocess.run([conftest.SPILLFS_BIN, "mkfs", volume, "--size", "1G"], check=True, capture_output=True)
    subprocess.run([conftest.SPILLFS_BIN, "mount", volume, mnt, "-o", "allow_other"], check=True,
                   capture_output=True)
    try:
        os.chmod(mnt, 0o755)
        user_dir = os.path.join(mnt, "user")
        os.mkdir(user_dir)
        os.chown(user_dir, 65534, 65534)
        env = dict(os.environ, PYTHONPATH=os.path.join(conftest.ROOT, "clients", "python"), HOME=home,
                   SPILLFS_CLIENT_LIB=lib)
        r = subprocess.run([sys.executable, "-c", _NOT_ROOT_CHILD, os.path.join(user_dir, "ckpt.pt")], env=env,
                           capture_output=True, text=True, timeout=300, cwd=home)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not [line for line in r.stdout.splitlines() if line.startswith("WARNING")], r.stdout + r.stderr
        saves = [line.split() for line in r.stdout.splitlines() if line.startswith("SAVE")]
        assert saves and saves[0][1] == "cpu", r.stdout + r.stderr
        for _, device, backend, io_path, shared1, io_path2, shared2, io_bytes2 in saves:
            assert (backend, io_path, io_path2) == ("native", "memory_io", "memory_io"), (device, r.stdout)
            assert int(shared1) == 0, (device, r.stdout)  # the first save shares nothing
            assert int(shared2) == 16 * 256 * KIB, (device, r.stdout)  # the second, every unit of t
            assert int(io_bytes2) < 16 * 256 * KIB, (device, r.stdout)  # and writes the rest only
        assert os.stat(os.path.join(user_dir, "ckpt.ptcpu")).st_uid == 65534
    finally:
        subprocess.run([conftest.SPILLFS_BIN, "umount", mnt], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", tmp], check=False)
