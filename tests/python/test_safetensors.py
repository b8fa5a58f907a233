"""spillfs.safetensors against the safetensors library (CPU torch; CUDA tests skip without a GPU).

Run: .venv/bin/python -m pytest -q tests/python/test_safetensors.py
Needs the safetensors library (the reference: each side reads the other's
files, errors are compared with its own); the transformers tests need
transformers (a tiny Llama built from a config, nothing downloaded). Tests on
a spillfs mount use conftest.py's `mount` fixture and skip without it.
"""

import errno
import json
import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
library = pytest.importorskip("safetensors.torch")
from safetensors import safe_open as library_safe_open  # noqa: E402

import spillfs.safetensors as st  # noqa: E402  (conftest.py puts clients/python on sys.path)
from spillfs import _native  # noqa: E402
from spillfs.safetensors import SafetensorError  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
UNIT = 256 * KIB

DTYPES = [d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.uint8,
                      torch.int8, torch.int16, torch.int32, torch.int64, torch.bool, getattr(torch, "uint16", None),
                      getattr(torch, "uint32", None), getattr(torch, "uint64", None),
                      getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None]


def make(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def sample(dtype):
    """Tensors of one dtype: whole units, units and a head/tail, small, scalar, empty."""
    size = torch.empty(0, dtype=dtype).element_size()
    return {"units": make(dtype, (2 * UNIT // size,), 1), "big": make(dtype, (300, 1001), 2),
            "small": make(dtype, (7, 3), 3), "scalar": make(dtype, (), 4), "empty": make(dtype, (0, 5), 5)}


def mixed():
    """Several dtypes and sizes in one file (what a state_dict holds)."""
    out = {}
    for i, dtype in enumerate((torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.float16)):
        for name, t in sample(dtype).items():
            out[f"{name}.{i}"] = t
    return out


def bits(t):
    """A tensor's dtype, shape and bytes (random bytes hold NaNs: == would not do)."""
    return t.dtype, tuple(t.shape), bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def same(a, b):
    """Dicts of tensors equal bit for bit, with their dtypes and shapes."""
    assert sorted(a) == sorted(b)
    for k in a:
        assert bits(a[k]) == bits(b[k]), k


def data_start(path):
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


WRITERS = {"spillfs": st.save_file, "library": library.save_file}
READERS = {"spillfs": st.load_file, "library": library.load_file}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("writer,reader", [("spillfs", "library"), ("library", "spillfs"), ("spillfs", "spillfs")])
def test_round_trip_both_ways(tmp_path, dtype, writer, reader):
    tensors = sample(dtype)
    path = tmp_path / "t.safetensors"
    WRITERS[writer](tensors, path, metadata={"format": "pt"})
    same(tensors, READERS[reader](path))
    with library_safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


@pytest.mark.parametrize("backend", ["native", "posix"])
def test_both_io_paths_write_the_same_file(tmp_path, backend):
    if backend == "native" and _native.segment_io() is None:
        pytest.skip("needs libspillfs_client with the segment I/O")
    tensors = mixed()
    r = st.save_file(tensors, tmp_path / "a.safetensors", backend=backend)
    assert r.backend == backend and r.file_bytes == os.path.getsize(tmp_path / "a.safetensors")
    assert r.crc32_skipped == 0 and r.storages == len(tensors)
    st.save_file(tensors, tmp_path / "b.safetensors", backend="posix")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    same(tensors, st.load_file(tmp_path / "a.safetensors", backend=backend))


def test_units_over_several_tensors_past_the_gather_limit_are_written_the_same(tmp_path, monkeypatch):
    from spillfs.safetensors import _files
    tensors = mixed()
    st.save_file(tensors, tmp_path / "gathered")
    monkeypatch.setattr(_files, "_GATHER_LIMIT", UNIT)  # one unit gathered, the others small records
    st.save_file(tensors, tmp_path / "limited")
    assert (tmp_path / "gathered").read_bytes() == (tmp_path / "limited").read_bytes()
    same(tensors, library.load_file(tmp_path / "limited"))


def test_without_big_tensors_the_file_is_the_librarys_byte_for_byte(tmp_path):
    tensors = {k: v for k, v in mixed().items() if v.numel() * v.element_size() < UNIT}
    # one metadata key: the library writes several in its hash map's order, which changes from run to run
    st.save_file(tensors, tmp_path / "ours", metadata={"format": "pt"})
    library.save_file(tensors, tmp_path / "theirs", metadata={"format": "pt"})
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()


def test_units_layout(tmp_path):
    """The data starts on a unit; whole-unit tensors first, each on a unit;
    offsets contiguous, every tensor aligned to its element size; the
    library reads it (its validation is the format's)."""
    tensors = mixed()
    path = tmp_path / "u.safetensors"
    st.save_file(tensors, path)
    start = data_start(path)
    assert start % UNIT == 0 and start > 8
    entries = sorted(((v["data_offsets"], k) for k, v in header(path).items()))
    at = 0
    for (begin, end), name in entries:
        assert begin == at
        assert begin % tensors[name].element_size() == 0, name
        at = end
    assert at + start == os.path.getsize(path)
    whole = [k for k, t in tensors.items() if t.numel() * t.element_size() % UNIT == 0 and t.numel()]
    assert whole and sorted(k for _, k in entries[:len(whole)]) == sorted(whole)
    assert all(begin % UNIT == 0 for (begin, _), _ in entries[:len(whole)])
    same(tensors, library.load_file(path))


# -- errors, as the library raises them ------------------------------------------

def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e).strip()
    return None


def test_what_the_library_refuses_to_save_is_refused_the_same_and_nothing_is_written(tmp_path):
    t = torch.ones(8)
    bad = [[1], {"a": 3}, {"a": torch.ones(4, 4).t()}, {"a": t, "b": t}, {"a": t[:6], "b": t[4:]},
           {"a": torch.zeros(2, dtype=torch.complex128)}, {1: torch.ones(2)}]
    for tensors in bad:
        theirs = _raised(lambda: library.save_file(tensors, tmp_path / "theirs"))
        ours = _raised(lambda: st.save_file(tensors, tmp_path / "ours"))
        assert theirs is not None and ours is not None, tensors
        assert ours[0] is theirs[0], (tensors, ours, theirs)
        if ours[0] is not RuntimeError:  # shared tensors: the same words, other line breaks
            assert ours[1] == theirs[1], (ours, theirs)
        assert not (tmp_path / "ours").exists()
    for metadata in ({"a": 1}, {1: "a"}, "x"):
        theirs = _raised(lambda: library.save_file({"a": t}, tmp_path / "theirs", metadata=metadata))
        ours = _raised(lambda: st.save_file({"a": t}, tmp_path / "ours", metadata=metadata))
        assert ours == theirs
    # disjoint slices of one storage are no sharing, for either
    st.save_file({"a": t[:4], "b": t[4:]}, tmp_path / "slices")
    same({"a": t[:4], "b": t[4:]}, library.load_file(tmp_path / "slices"))


def test_bad_files_raise_what_the_library_raises(tmp_path):
    good = library.save({"a": torch.ones(2, 2), "b": torch.zeros(3)}, metadata={"format": "pt"})

    def file(entries, data):
        h = json.dumps(entries).encode()
        return struct.pack("<Q", len(h)) + h + data

    cases = {
        "empty": b"", "short": b"abc", "too large": struct.pack("<Q", 200_000_000) + b"{}",
        "length past the end": struct.pack("<Q", 100) + b"{}", "truncated": good[:-4], "extra bytes": good + b"1234",
        "gap": file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}, bytes(24)),
        "shape and size": file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
    }
    for what, data in cases.items():
        path = tmp_path / "bad.safetensors"
        path.write_bytes(data)
        theirs = _raised(lambda: library_safe_open(str(path), framework="pt"))
        ours = _raised(lambda: st.safe_open(path, framework="pt"))
        assert theirs[0] is SafetensorError and ours == theirs, (what, ours, theirs)
    for what, data in {"not JSON": struct.pack("<Q", 4) + b"abcd",
                       "a dtype it lacks": file({"a": {"dtype": "X32", "shape": [2], "data_offsets": [0, 8]}},
                                                bytes(8)),
                       "metadata not strings": file({"__metadata__": {"x": 1}}, b"")}.items():
        path = tmp_path / "bad.safetensors"
        path.write_bytes(data)
        with pytest.raises(SafetensorError, match="^Error while deserializing header: invalid JSON in header"):
            st.safe_open(path, framework="pt")
        with pytest.raises(SafetensorError, match="^Error while deserializing header: invalid JSON in header"):
            library_safe_open(str(path), framework="pt")
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        st.load_file(tmp_path / "nowhere.safetensors")


def test_a_save_that_fails_raises_a_safetensor_error_with_its_errno(tmp_path):
    with pytest.raises(SafetensorError, match="^.*Error while serializing: I/O error") as info:
        st.save_file({"a": torch.ones(2)}, tmp_path / "no" / "dir.safetensors")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOENT
    assert info.value.filename == str(tmp_path / "no" / "dir.safetensors")


def test_safe_open_reads_as_the_librarys(tmp_path):
    tensors = mixed()
    path = tmp_path / "s.safetensors"
    st.save_file(tensors, path, metadata={"step": "7"})
    with st.safe_open(path, framework="pt", device="cpu") as ours, \
            library_safe_open(str(path), framework="pt", device="cpu") as theirs:
        assert ours.keys() == theirs.keys()
        assert ours.offset_keys() == theirs.offset_keys()
        assert ours.metadata() == theirs.metadata() == {"step": "7"}
        for name in ours.keys():
            assert bits(ours.get_tensor(name)) == bits(theirs.get_tensor(name))
            a, b = ours.get_slice(name), theirs.get_slice(name)
            assert (a.get_shape(), a.get_dtype()) == (b.get_shape(), b.get_dtype())
        big_ours, big_theirs = ours.get_slice("big.1"), theirs.get_slice("big.1")
        for index in (slice(3, 10), (slice(None), 2), -1, 0, slice(None, None, 7), Ellipsis, (slice(5, 9), slice(1, 4)),
                      slice(290, 400), (2, 5)):
            assert bits(big_ours[index]) == bits(big_theirs[index]), index
        assert bits(ours.get_slice("scalar.1")[...]) == bits(theirs.get_slice("scalar.1")[...])
        with pytest.raises(IndexError):
            big_ours[300]
        for fn in (ours.get_tensor, ours.get_slice):
            assert _raised(lambda: fn("missing")) == _raised(lambda: theirs.get_tensor("missing"))
        assert set(ours.get_tensors()) == set(tensors)
    assert _raised(ours.keys) == (SafetensorError, "File is closed")
    assert _raised(lambda: st.safe_open(path, framework="xx")) == \
        _raised(lambda: library_safe_open(str(path), framework="xx"))
    assert _raised(lambda: st.safe_open(path, framework="pt", device="foo")) == \
        _raised(lambda: library_safe_open(str(path), framework="pt", device="foo"))
    with st.safe_open(path, framework="np") as f:
        assert (f.get_tensor("small.1") == tensors["small.1"].numpy()).all()


# -- on a spillfs mount ------------------------------------------------------------

def _physical_bytes(mount):
    from conftest import SPILLFS_BIN
    out = subprocess.run([SPILLFS_BIN, "stat", "--json", mount], check=True, capture_output=True, text=True)
    stats = json.loads(out.stdout)
    return stats.get("used_bytes", stats.get("physical_bytes"))


def test_on_a_spillfs_mount_both_ways(mount):
    tensors = mixed()
    for writer, reader in (("spillfs", "library"), ("library", "spillfs"), ("spillfs", "spillfs")):
        path = os.path.join(mount, f"{writer}-{reader}.safetensors")
        WRITERS[writer](tensors, path)
        same(tensors, READERS[reader](path))
    assert [n for n in os.listdir(mount) if "spillfs-tmp" in n] == []


def llama_like(layers=4, hidden=512, intermediate=1408, vocab=8000, seed=0):
    """A transformer's state_dict in bf16 (whole-unit and other sizes; norms)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)
    sd = {"embed_tokens.weight": w(vocab, hidden), "norm.weight": w(hidden), "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        for n in ("q", "k", "v", "o"):
            sd[f"layers.{i}.{n}_proj.weight"] = w(hidden, hidden)
        for n, shape in (("gate", (intermediate, hidden)), ("up", (intermediate, hidden)),
                         ("down", (hidden, intermediate))):
            sd[f"layers.{i}.{n}_proj.weight"] = w(*shape)
        sd[f"layers.{i}.input_layernorm.weight"] = w(hidden)
        sd[f"layers.{i}.post_attention_layernorm.weight"] = w(hidden)
    return sd


def test_a_second_save_with_1_percent_changed_writes_about_that_1_percent(mount):
    """Tensors whose size is not a whole number of units (1408 x 512 bf16 =
    5.5 units) and small ones are in the file too: the units they share,
    gathered, are shared all the same when unchanged; what the second save
    writes is the units of the changed tensors, the header's unit and the
    last, partial unit of the data."""
    if _native.segment_io() is None:
        pytest.skip("dedup needs libspillfs_client with the segment I/O")
    sd = llama_like()
    total = sum(t.numel() * t.element_size() for t in sd.values())
    r1 = st.save_file(sd, os.path.join(mount, "step1.safetensors"))
    assert r1.dedup and r1.dedup_requests == 1
    before = _physical_bytes(mount)
    changed = ["layers.2.q_proj.weight", "norm.weight"]  # 0.5 MiB + 1 KiB of 30 MiB: ~1.7%
    first = {name: sd[name].clone() for name in changed}
    for name in changed:
        sd[name].add_(1)
    r2 = st.save_file(sd, os.path.join(mount, "step2.safetensors"))
    changed_bytes = sum(sd[n].numel() * sd[n].element_size() for n in changed)
    print(f"\n1%-changed second save: {r2.bytes_written} bytes written of a {r2.file_bytes}-byte file "
          f"({total} bytes of tensors, {changed_bytes} changed), {r2.bytes_shared} shared")
    assert r2.dedup and r2.bytes_shared > 0
    # each changed tensor's units (up to one more unit a tensor where it straddles), the header, the last unit
    assert changed_bytes <= r2.bytes_written <= changed_bytes + (len(changed) + 2) * UNIT
    assert r2.bytes_written + r2.bytes_shared == r2.file_bytes
    if before is not None:
        assert _physical_bytes(mount) - before < r2.bytes_written + 64 * KIB
    same(sd, library.load_file(os.path.join(mount, "step2.safetensors")))
    same({**sd, **first}, st.load_file(os.path.join(mount, "step1.safetensors")))


# -- transformers ------------------------------------------------------------------

def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _save_and_load_pretrained(model, directory):
    import transformers.modeling_utils as modeling_utils
    with st.patch_transformers() as patch:
        # what save_pretrained / from_pretrained call (transformers 4.x and 5.x bind these names)
        assert modeling_utils.safe_save_file is st.save_file and modeling_utils.safe_open is st.safe_open
        assert patch.replaced
        model.save_pretrained(directory)
        back = type(model).from_pretrained(directory)
    return back


@pytest.mark.parametrize("where", ["tmp", "mount"])
def test_save_pretrained_and_from_pretrained_through_the_patch(tmp_path, request, where):
    directory = str(tmp_path / "llama") if where == "tmp" else os.path.join(request.getfixturevalue("mount"), "llama")
    model = tiny_llama()
    import safetensors
    originals = (library.save_file, library.load_file, safetensors.safe_open)
    back = _save_and_load_pretrained(model, directory)
    assert (library.save_file, library.load_file, safetensors.safe_open) == originals  # undone
    sd = model.state_dict()
    same(sd, back.state_dict())
    path = os.path.join(directory, "model.safetensors")
    assert data_start(path) % UNIT == 0  # written by spillfs.safetensors (the library pads to 8 bytes)
    on_disk = library.load_file(path)
    same({k: sd[k] for k in on_disk}, on_disk)
    with library_safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_python_m_spillfs_safetensors_runs_an_unchanged_script(tmp_path):
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, transformers\n"
        "config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,\n"
        "    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)\n"
        "transformers.LlamaForCausalLM(config).save_pretrained(sys.argv[1])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "clients", "python"),
        os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "spillfs.safetensors", str(script), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert data_start(out / "model.safetensors") % UNIT == 0  # spillfs.safetensors wrote it
    assert sorted(library.load_file(out / "model.safetensors"))


# -- CUDA --------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")


@cuda
@pytest.mark.parametrize("backend", ["auto", "posix"])
def test_cuda_tensors_both_ways(tmp_path, backend):
    tensors = {k: v.cuda() for k, v in mixed().items()}
    path = tmp_path / "c.safetensors"
    st.save_file(tensors, path, backend=backend)
    same({k: v.cpu() for k, v in tensors.items()}, library.load_file(path))
    back = st.load_file(path, device="cuda:0", backend=backend)
    assert all(v.device.type == "cuda" for v in back.values())
    same(tensors, back)
    library.save_file(tensors, tmp_path / "theirs.safetensors")
    same(tensors, st.load_file(tmp_path / "theirs.safetensors", device=0))
    with st.safe_open(path, framework="pt", device="cuda") as f:
        assert f.get_slice("big.1")[3:5].device.type == "cuda"
        assert bits(f.get_slice("big.1")[3:5]) == bits(tensors["big.1"][3:5])


@cuda
def test_cuda_second_save_on_a_mount_hashes_on_the_gpu(mount):
    if _native.segment_io() is None:
        pytest.skip("needs libspillfs_client with the segment I/O")
    sd = {k: v.cuda() for k, v in llama_like().items()}
    st.save_file(sd, os.path.join(mount, "c1.safetensors"))
    sd["layers.1.k_proj.weight"].add_(1)
    r = st.save_file(sd, os.path.join(mount, "c2.safetensors"))
    assert r.dedup and r.device_bytes > 0 and r.bytes_shared > 0
    assert r.bytes_written < 4 * MIB
    same(sd, st.load_file(os.path.join(mount, "c2.safetensors"), device="cuda"))
