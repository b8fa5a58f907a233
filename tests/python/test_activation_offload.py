"""spillfs.torch.offload_activations: exact gradients, dedup and forwarding
counters, nothing left behind, parameters never offloaded, full disks, and
(on a GPU) the same in bf16 with peak-memory assertions.

CPU tests run under Debian's torch 1.13; the CUDA ones skip, saying so,
where no GPU is present. The mount test uses the `mount` fixture (root,
/dev/fuse, SPILLFS_BIN).
"""

import contextlib
import errno
import gc
import os
import sys
import time
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import spillfs.torch as st
from spillfs.torch._offload import tiers as _tiers
from spillfs.torch._offload.policy import _Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools", "bench"))
from toy_gpt import GPT  # noqa: E402  (the bench's model, tiny here)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (GPU machine)")


# -- models -------------------------------------------------------------------

def mlp(width=96, depth=4):
    blocks = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]
    return nn.Sequential(*blocks, nn.Linear(width, 8))


def train(make_model, make_batch, loss_fn, offload=None, steps=3, device="cpu", dtype=torch.float32,
          checkpoint=None, between=None):
    """Losses and final parameters after `steps` AdamW steps (same seed each call);
    `between(offloader)` runs after each forward, before its backward."""
    torch.manual_seed(1)
    model = make_model().to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    off = offload(model) if offload is not None else None
    losses = []
    for step in range(steps):
        x, y = make_batch(step, device)

        def fwd_bwd():
            if checkpoint is not None:
                out = checkpoint(model, x)
            else:
                out = model(x)
            loss = loss_fn(out, y)
            if between is not None and off is not None:
                between(off)
            loss.backward()
            return loss

        if off is not None:
            with off:
                loss = fwd_bwd()
        else:
            loss = fwd_bwd()
        losses.append(loss.detach().cpu())
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = [p.detach().cpu().clone() for p in model.parameters()]
    return losses, params, off


def mlp_batch(step, device):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(64, 96, generator=g).to(device), torch.randn(64, 8, generator=g).to(device)


def gpt_batch(step, device):
    g = torch.Generator().manual_seed(200 + step)
    idx = torch.randint(0, 64, (4, 16), generator=g)
    return idx.to(device), torch.randint(0, 64, (4, 16), generator=g).to(device)


def gpt_loss(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def mse(out, y):
    return F.mse_loss(out.float(), y.float())


def _same(a, b):
    return ([x.item() for x in a[0]] == [x.item() for x in b[0]]
            and all(torch.equal(p, q) for p, q in zip(a[1], b[1])))


def assert_matches(run_ref, got):
    """Bitwise equal to a run without offloading, where such runs are themselves
    reproducible; where they are not (CUDA kernels with atomics, e.g. some
    attention backwards), within the spread of two of them."""
    ref = run_ref()
    if CUDA:
        ref2 = run_ref()
        if not _same(ref, ref2):
            spread = max((p - q).abs().max().item() for p, q in zip(ref[1], ref2[1]))
            for p, q in zip(ref[1], got[1]):
                assert (p.float() - q.float()).abs().max().item() <= 4 * spread + 1e-6
            assert got[2] is None or got[2].in_use() == {"host_bytes": 0, "files": [], "entries": 0}
            return
    assert_same(ref, got)


def assert_same(a, b):
    la, pa, _ = a
    lb, pb, off = b
    assert [x.item() for x in la] == [x.item() for x in lb]
    for p, q in zip(pa, pb):
        assert torch.equal(p, q)
    if off is not None:
        left = off.in_use()
        assert left == {"host_bytes": 0, "files": [], "entries": 0}, left


# -- exact gradients -----------------------------------------------------------

HOST_SETTINGS = {
    "host_ample": dict(host_bytes=1 << 30),
    "files_only": dict(host_bytes=0, files=True),
    "in_between": dict(host_bytes=96 << 10, files=True),
}


def offloader(tmp_path, setting, policy="all", **kw):
    s = dict(HOST_SETTINGS[setting])
    d = str(tmp_path / "act") if s.pop("files", False) else None
    return lambda model: st.offload_activations(d, host_bytes=s["host_bytes"], min_bytes=kw.pop("min_bytes", 1024),
                                                prefetch_layers=kw.pop("prefetch_layers", 1), policy=policy,
                                                layers=model, **kw)


@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
@pytest.mark.parametrize("policy", ["all", "adaptive"])
def test_mlp_bitwise(tmp_path, setting, policy):
    ref = train(mlp, mlp_batch, mse)
    got = train(mlp, mlp_batch, mse, offloader(tmp_path, setting, policy))
    assert_same(ref, got)
    r = got[2].report
    if policy == "all":
        assert r.host_bytes + r.ssd_bytes > 0
        if setting == "files_only":
            assert r.host_bytes == 0 and r.ssd_bytes > 0
        if setting == "in_between":
            assert r.host_bytes > 0 and r.ssd_bytes > 0


@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
@pytest.mark.parametrize("policy", ["all", "adaptive"])
def test_transformer_bitwise(tmp_path, setting, policy):
    ref = train(GPT, gpt_batch, gpt_loss)
    got = train(GPT, gpt_batch, gpt_loss, offloader(tmp_path, setting, policy, min_bytes=512))
    assert_same(ref, got)
    off = got[2]
    assert [len(off.layers)] == [3]  # found GPT.blocks
    if policy == "all":
        assert off.report.offloaded_bytes > 0
    else:
        assert off.reports[0].policy == "adaptive:profile"
        assert off.report.predicted and "step_seconds" in off.report.measured
        assert set(off.report.decisions.values()) <= {"keep", "host", "ssd"}


def test_policy_none_runs_without_saved_tensor_hooks(tmp_path, monkeypatch):
    """policy="none" keeps everything, so its steps install no saved-tensor hooks (no Python per saved
    tensor, issue 43): torch sees no pack hook, the report says so, the gradients are keep's."""
    from spillfs.torch._offload import saved_hooks
    packs = []
    real_pack = saved_hooks._SavedTensorHooks.pack
    monkeypatch.setattr(saved_hooks._SavedTensorHooks, "pack", lambda self, t: packs.append(1) or real_pack(self, t))
    ref = train(GPT, gpt_batch, gpt_loss)
    got = train(GPT, gpt_batch, gpt_loss, offloader(tmp_path, "host_ample", "none", min_bytes=512))
    assert_same(ref, got)
    r = got[2].report
    assert r.policy == "none" and r.saved_hooks is False
    assert packs == [] and r.packed_count == 0 and r.offloaded_bytes == 0
    assert "step_seconds" in r.measured
    # the same model with policy="all" does go through pack: the check above can fail
    all_ = train(GPT, gpt_batch, gpt_loss, offloader(tmp_path, "host_ample", "all", min_bytes=512))
    assert all_[2].report.saved_hooks is True and packs and all_[2].report.packed_count > 0


def test_transformer_on_mount(mount):
    """All to files on a spillfs mount: the segment I/O (direct path as root)."""
    d = os.path.join(mount, "act")
    ref = train(GPT, gpt_batch, gpt_loss)
    got = train(GPT, gpt_batch, gpt_loss,
                lambda m: st.offload_activations(d, host_bytes=0, min_bytes=512, policy="all", layers=m),
                between=_writes_land)
    assert_same(ref, got)
    r = got[2].report
    assert r.ssd_bytes > 0 and r.read_ssd_bytes > 0
    from spillfs import _native
    if _native.segment_io() is not None:
        assert r.io_backend in ("direct_path", "mount"), r.io_backend
    got[2].close()
    assert not [n for n in os.listdir(d) if n.startswith("spillfs-act-")]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_inside(tmp_path, reentrant):
    from torch.utils.checkpoint import checkpoint

    class Ckpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = GPT()

        def forward(self, idx):
            inner = self.inner
            x = inner.wte(idx) + inner.wpe(torch.arange(idx.shape[1]))
            for blk in inner.blocks:
                x = checkpoint(blk, x, use_reentrant=reentrant)
            return inner.head(inner.ln(x))

    ref = train(Ckpt, gpt_batch, gpt_loss)
    got = train(Ckpt, gpt_batch, gpt_loss, offloader(tmp_path, "in_between", min_bytes=512))
    assert_same(ref, got)


def test_prefetch_follows_layers(tmp_path):
    """Layers drive the prefetch: every read is started before backward needs it."""
    got = train(mlp, mlp_batch, mse, offloader(tmp_path, "host_ample", prefetch_layers=1, min_bytes=1024))
    r = got[2].report
    assert r.host_count >= 3
    assert r.stalls == 0
    assert r.prefetch_hits + r.forwarded_count == r.host_count


def test_read_ahead_is_paced_by_backward(tmp_path):
    """prefetch_layers=1 reads the layer ahead as backward frees the one it runs (bytes for
    bytes), not all at once beside it: what was read back and not yet used stays within about
    one layer, and still nothing stalls."""
    got = train(lambda: mlp(depth=8), mlp_batch, mse, offloader(tmp_path, "host_ample", prefetch_layers=1,
                                                                min_bytes=1024))
    r = got[2].report
    layer = max(r.layer_bytes[g] for g in r.layer_bytes if isinstance(g, int) and g >= 0)
    entry = 64 * 96 * 4  # the largest tensor a block saves
    assert r.stalls == 0
    assert r.read_host_bytes > 2 * layer
    assert 0 < r.read_ahead_peak_bytes <= layer + entry, (r.read_ahead_peak_bytes, layer)


# -- crafted graphs: dedup and forwarding ------------------------------------

def crafted(alive):
    """a saved twice (sin, cos) and through a transposed view (same bytes), a
    slice of it (another offset: stored apart), and a last tensor (kept)."""
    w = torch.randn(64, 64, requires_grad=True)
    off = st.offload_activations(None, host_bytes=1 << 20, min_bytes=1024, policy="all")
    with off:
        a = w * 2
        b = a.sin() + a.cos() + a.t().t().exp()  # a: saved three times, the last through a view of the same bytes
        c = a[8:].tanh()                           # a[8:]: another offset (tanh saves its result, c)
        d = (b[8:] * c).sum()                      # saves b[8:] and c; c is the last one: kept
        keep = (a, b) if alive else ()
        del a, b, c
        d.backward()
    return off.report, w.grad.clone(), keep


def test_dedup_and_forwarding_counts():
    torch.manual_seed(0)
    r, g1, _ = crafted(alive=False)
    # stored: a, exp(a), b[8:]... see below
    assert r.deduped_count == 2, r.as_dict()  # a by cos, a.t().t() by exp
    assert r.forwarded_count == 0
    assert r.kept_reasons.get("last") == 1
    stored = r.host_count
    torch.manual_seed(0)
    r2, g2, keep = crafted(alive=True)
    assert torch.equal(g1, g2)
    assert r2.deduped_count == 2 and r2.host_count == stored
    # a (alive) and b[8:] (a view of alive b: another tensor object, so not alive itself) -> a only
    assert r2.forwarded_count == 1
    assert r2.forwarded_bytes == 64 * 64 * 4


def test_saved_twice_exact():
    def grad_of(off):
        w = (0.3 * torch.randn(256, generator=torch.Generator().manual_seed(5))).requires_grad_()
        with (off if off is not None else contextlib.nullcontext()):
            a = w * 3
            y = a * a          # mul saves both operands: the same tensor twice
            z = y.exp()        # exp saves its result
            s = (z * 2).sum()
            del a, y, z
            s.backward()
        return w.detach(), w.grad

    off = st.offload_activations(None, host_bytes=1 << 20, min_bytes=512, policy="all")
    w, got = grad_of(off)
    r = off.report
    assert r.deduped_count == 1 and r.deduped_bytes == 1024
    assert r.host_count == 1  # a; z (exp's result) is the last: kept
    assert torch.equal(got, grad_of(None)[1])
    # d/dw of sum(2 exp((3w)^2)) = 36 w exp(9 w^2)
    assert torch.allclose(got, 36 * w * torch.exp(9 * w * w), rtol=1e-5, atol=1e-6)


# -- nothing left ---------------------------------------------------------------

def _files(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.join(root, n) for n in names]
    return out


def test_nothing_left_after_step(tmp_path):
    d = tmp_path / "act"
    model = GPT()
    off = st.offload_activations(d, host_bytes=64 << 10, min_bytes=512, policy="all", layers=model)
    x, y = gpt_batch(0, "cpu")
    with off:
        gpt_loss(model(x), y).backward()
    assert off.report.ssd_bytes > 0 and off.report.host_bytes > 0
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    assert _files(d) == []
    off.close()
    assert os.listdir(d) == []


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_nothing_left_after_exception(tmp_path, exc, where):
    d = tmp_path / "act"
    model = GPT()

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise exc("boom in backward")

    off = st.offload_activations(d, host_bytes=64 << 10, min_bytes=512, policy="all", layers=model)
    x, y = gpt_batch(0, "cpu")
    with pytest.raises(exc):
        with off:
            h = model.wte(x) + 0
            h = Boom.apply(h)  # first in forward, so last in backward: everything else was saved
            for blk in model.blocks:
                h = blk(h)
            loss = gpt_loss(model.head(model.ln(h)), y)
            if where == "forward":
                raise exc("boom in forward")
            loss.backward()
    assert off.report.offloaded_bytes > 0
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    assert _files(d) == []
    if where == "forward":
        with pytest.raises(RuntimeError, match="released"):
            loss.backward()
    # the offloader goes on working
    with off:
        gpt_loss(model(x), y).backward()
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    off.close()


_KILLED_CHILD = """
import sys, time, torch
import spillfs.torch as st
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(4)])
off = st.offload_activations(sys.argv[1], host_bytes=0, min_bytes=1024, policy="all", layers=list(model))
with off:
    loss = model(torch.randn(64, 256)).square().sum()
    off._state.worker.drain()  # the files written: killed between forward and backward
    print(off._copies.files.path, flush=True)
    time.sleep(120)
"""


def _killed_mid_offload_leaves_then_reclaimed(d):
    """A process killed (SIGKILL) between forward and backward leaves its directory of files; the
    next tier opened under the same `dir` removes it, and only it."""
    import signal
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, d], stdout=subprocess.PIPE, env=env, text=True)
    try:
        left = child.stdout.readline().strip()
        assert left.startswith(os.path.join(os.path.abspath(d), _tiers.FileTier.PREFIX + str(child.pid))), left
        assert os.listdir(left), "the child wrote no files before it was killed"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL and os.path.isdir(left)
    alive = os.path.join(d, f"{_tiers.FileTier.PREFIX}{os.getppid()}-0")  # a live process's: kept
    os.makedirs(alive, exist_ok=True)
    model = GPT()
    off = st.offload_activations(d, host_bytes=0, min_bytes=512, policy="all", layers=model)
    x, y = gpt_batch(0, "cpu")
    with off:
        gpt_loss(model(x), y).backward()
    assert off.report.ssd_bytes > 0
    assert not os.path.exists(left), os.listdir(left)
    assert os.path.isdir(alive)
    off.close()
    os.rmdir(alive)
    return off


def test_killed_process_leftovers_removed_at_next_open(tmp_path):
    _killed_mid_offload_leaves_then_reclaimed(str(tmp_path / "act"))


def test_ephemeral_directory_on_mount(mount):
    """On a spillfs mount the tier's directory is marked ephemeral (its files stay in the RAM tier),
    and a killed process's leftovers there are removed at the next opening too."""
    d = os.path.join(mount, "act-ephemeral")
    tier = _tiers.FileTier(d)
    try:
        assert tier.ephemeral
        assert os.getxattr(tier.path, _tiers.EPHEMERAL_XATTR) == b"1"
    finally:
        tier.close()
    _killed_mid_offload_leaves_then_reclaimed(d)


def test_backward_outside_block_frees_as_consumed(tmp_path):
    model = GPT()
    off = st.offload_activations(tmp_path / "act", host_bytes=0, min_bytes=512, policy="all", layers=model)
    x, y = gpt_batch(0, "cpu")
    with off:
        loss = gpt_loss(model(x), y)
    assert off.in_use()["entries"] > 0
    loss.backward()
    del loss
    gc.collect()
    off._state.worker.drain()
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}


def test_graph_dropped_without_backward(tmp_path):
    model = GPT()
    off = st.offload_activations(tmp_path / "act", host_bytes=32 << 10, min_bytes=512, policy="all", layers=model)
    x, y = gpt_batch(0, "cpu")
    with off:
        loss = gpt_loss(model(x), y)
    del loss
    gc.collect()
    off._state.worker.drain()
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}


# -- parameters -----------------------------------------------------------------

class ViewsOfWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(128, 128))
        self.register_buffer("table", torch.randn(128, 128))

    def forward(self, x):
        w_slice = self.weight[:, :64]           # a view of a parameter (non-leaf, _base is it)
        w_det = self.weight.detach()            # shares the storage, no grad, a leaf
        y = (x @ w_det).tanh() @ self.table     # matmul saves w_det and the buffer
        return (x[:, :64] * 0 + (x @ w_slice)).sin().sum() + y.sum()


def test_parameters_never_offloaded():
    model = ViewsOfWeights()
    x = torch.randn(128, 128, requires_grad=True) * 1  # a non-leaf needing grad: the matmuls save their weights
    off = st.offload_activations(None, host_bytes=1 << 30, min_bytes=1, policy="all", layers=None)
    off._state.trace = []
    with off:
        model(x).backward()
    r = off.report
    assert r.kept_reasons.get("parameter", 0) >= 3, r.kept_reasons
    owned = {_ptr(p) for p in model.parameters()} | {_ptr(b) for b in model.buffers()}
    stored = {row[0] for row in off._state.trace if len(row) == 3}
    assert stored and not (stored & owned)
    assert r.host_count > 0


def _ptr(t):
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t._storage().data_ptr()


# -- full disk ------------------------------------------------------------------

def _writes_land(off):
    """Waits for the worker (its writes) before backward: with staged writes, a tensor that
    backward consumes first is never written, so a failure would depend on timing."""
    off._state.worker.drain()


def _staging(staged, make):
    def build(model):
        off = make(model)
        if not staged:
            off.staging_bytes = 0  # written straight from the tensor's memory
        return off
    return build


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "direct"])
@pytest.mark.parametrize("when", ["submit", "wait"])
def test_full_disk_keeps_and_warns(tmp_path, monkeypatch, when, staged):
    real_write = _tiers.LayerFile.write

    def failing_write(self, *args, **kw):
        if when == "submit":
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        req = real_write(self, *args, **kw)
        inner = req.wait

        class Failing:
            def wait(self_inner):
                inner()
                raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return Failing()

    monkeypatch.setattr(_tiers.LayerFile, "write", failing_write)
    ref = train(GPT, gpt_batch, gpt_loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(GPT, gpt_batch, gpt_loss, _staging(staged, offloader(tmp_path, "files_only", min_bytes=512)),
                    between=_writes_land)
    assert_same(ref, got)
    assert any("keeping them in memory" in str(w.message) and issubclass(w.category, RuntimeWarning) for w in caught)
    reports = got[2].reports
    assert all(r.write_errors > 0 for r in reports)  # each step tries the disk again
    if not staged:  # written from the tensor: kept; staged: served from the staging region
        assert all(r.kept_reasons.get("error", 0) + r.kept_reasons.get("no_room", 0) > 0 for r in reports)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "direct"])
def test_real_full_disk(tmp_path, staged):
    """A small tmpfs: the library's (or Python's) own ENOSPC."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=64k tmpfs {d} 2>/dev/null") != 0:
        pytest.skip("needs root and tmpfs mounts")
    try:
        ref = train(GPT, gpt_batch, gpt_loss)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(GPT, gpt_batch, gpt_loss, _staging(staged, lambda m: st.offload_activations(
                d, host_bytes=0, min_bytes=512, policy="all", layers=m)), between=_writes_land)
        assert_same(ref, got)
        assert any("keeping them in memory" in str(w.message) for w in caught)
        got[2].close()
    finally:
        os.system(f"umount {d}")


# -- arguments and torch.compile ---------------------------------------------------

def test_bad_arguments():
    with pytest.raises(ValueError):
        st.offload_activations(host_bytes=-1)
    with pytest.raises(ValueError):
        st.offload_activations(policy="sometimes")
    with pytest.raises(TypeError):
        st.offload_activations(layers=[1, 2])
    off = st.offload_activations()
    with off:
        with pytest.raises(RuntimeError, match="reentrant"):
            off.__enter__()


def test_find_layers():
    assert len(st.find_layers(GPT(depth=5))) == 5
    assert len(st.find_layers(mlp(depth=3))) == 4  # a Sequential's children


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch 2.x (Debian's torch is 1.13)")
def test_compiled_layers_inside_block(tmp_path):
    """The hooks stay outside compiled code: compiled blocks inside the with block."""
    torch._dynamo.reset()

    def make():
        m = GPT()
        for i, blk in enumerate(m.blocks):
            m.blocks[i] = torch.compile(blk, backend="aot_eager")
        return m

    ref = train(make, gpt_batch, gpt_loss, steps=2)
    try:
        got = train(make, gpt_batch, gpt_loss, offloader(tmp_path, "host_ample", min_bytes=512), steps=2)
    except RuntimeError as e:  # a torch that refuses even hooks around compiled code: say so, loudly
        if "hook" in str(e).lower():
            pytest.xfail(f"this torch refuses saved-tensor hooks around compiled code: {e}")
        raise
    assert_same(ref, got)
    print("offloaded around compiled blocks:", got[2].report.summary())


# -- CUDA (GPU machine) ------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
@pytest.mark.parametrize("policy", ["all", "adaptive"])
def test_cuda_bf16_bitwise(tmp_path, setting, policy):
    make = lambda: GPT(vocab=256, h=256, heads=4, depth=4, ctx=128)  # noqa: E731

    def batch(step, device):
        g = torch.Generator().manual_seed(300 + step)
        return (torch.randint(0, 256, (8, 128), generator=g).to(device),
                torch.randint(0, 256, (8, 128), generator=g).to(device))

    s = dict(HOST_SETTINGS[setting])
    if setting == "in_between":
        s["host_bytes"] = 8 << 20
    d = str(tmp_path / "act") if s.pop("files", False) else None
    got = train(make, batch, gpt_loss, device="cuda", dtype=torch.bfloat16, steps=4,
                offload=lambda m: st.offload_activations(d, host_bytes=s["host_bytes"], min_bytes=64 << 10,
                                                         policy=policy, layers=m))
    assert_matches(lambda: train(make, batch, gpt_loss, device="cuda", dtype=torch.bfloat16, steps=4), got)
    if policy == "all":
        assert got[2].report.offloaded_bytes > 0


@needs_cuda
def test_cuda_peak_memory(tmp_path):
    """Offloading every layer to the host tier cuts the activation peak by at least half,
    where each layer's compute outlasts its copy (a GPU spin of ~10 ms a layer stands
    in for the compute of a large hidden size; at this small one PCIe could not keep up)."""
    h, depth, t, b = 1024, 8, 512, 8
    torch.manual_seed(0)
    model = GPT(vocab=512, h=h, heads=8, depth=depth, ctx=t).cuda().to(torch.bfloat16)
    spin = [blk.register_forward_pre_hook(lambda m, a: torch.cuda._sleep(20_000_000)) for blk in model.blocks]
    x = torch.randint(0, 512, (b, t), device="cuda")

    def peak(off):
        for _ in range(2):  # the second step is measured (pinned slabs, cuBLAS workspaces warm)
            torch.cuda.synchronize()
            model.zero_grad(set_to_none=False)
            gc.collect()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            if off is None:
                gpt_loss(model(x), x).backward()
            else:
                with off:
                    gpt_loss(model(x), x).backward()
            torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    try:
        keep = peak(None)
        off = st.offload_activations(None, host_bytes=16 << 30, min_bytes=1 << 20, policy="all", layers=model)
        offl = peak(off)
        assert off.report.host_bytes > 0
        assert offl < 0.5 * keep, (offl, keep, off.report.summary())
        assert off.in_use()["host_bytes"] == 0
        off.close()
        # files only: the originals stay until the disk has them (~2 GB/s), so no cut is promised; no growth
        ssd = st.offload_activations(str(tmp_path / "act"), host_bytes=0, min_bytes=1 << 20, policy="all",
                                     layers=model)
        assert peak(ssd) <= 1.1 * keep
        assert ssd.report.ssd_bytes > 0 and ssd.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
        ssd.close()
    finally:
        for hook in spin:
            hook.remove()


@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
def test_views_with_gaps(tmp_path, setting):
    """Slices with gaps (q, k, v of a fused projection) and expanded tensors come back
    dense in the same order of dimensions, with exact gradients."""

    def grads(offload):
        torch.manual_seed(3)
        w = torch.randn(16, 3 * 64, requires_grad=True)
        e = torch.randn(1, 64, requires_grad=True)
        ctx = offload() if offload else None
        with (ctx if ctx is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            x = w * 2
            q, k, v = x.split(64, dim=1)             # strides (192, 1): gaps
            big = (e * 1).expand(16, 64)             # stride 0: overlap
            out = (q.sin() * k.t().t().cos() + v.transpose(0, 1).tanh().t() * big.exp()).sum()
            del x, q, k, v, big
            out.backward()
        return w.grad.clone(), e.grad.clone(), ctx

    s = dict(HOST_SETTINGS[setting])
    d = str(tmp_path / "act") if s.pop("files", False) else None
    gw, ge, _ = grads(None)
    hw, he, off = grads(lambda: st.offload_activations(d, host_bytes=min(s["host_bytes"], 8 << 10), min_bytes=256,
                                                       policy="all"))
    assert torch.equal(gw, hw) and torch.equal(ge, he)
    assert off.report.offloaded_bytes > 0
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}


@pytest.mark.skipif(__import__("importlib").util.find_spec("transformers") is None,
                    reason="transformers is not installed (it is on the GPU machine)")
@pytest.mark.parametrize("policy", ["all", "mixed"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hugging_face_models(tmp_path, arch, policy):
    """GPT-2 and Llama built from a config (random weights, nothing downloaded): layers found, exact;
    the mixed policy's plan (a layer recomputed, one hooked and offloaded, one kept) on their layers."""
    import transformers

    def make():
        if arch == "gpt2":
            # no KV cache while training (as transformers' own gradient checkpointing sets): a cache
            # updated by the forward changes what a recomputation runs
            cfg = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=3, n_head=4,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
            return transformers.GPT2LMHeadModel(cfg)
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                       use_cache=False)
        return transformers.LlamaForCausalLM(cfg)

    def batch(step, device):
        g = torch.Generator().manual_seed(400 + step)
        idx = torch.randint(0, 128, (2, 32), generator=g).to(device)
        return idx, idx

    def loss_fn(out, y):
        return out.logits.float().log_softmax(-1).gather(-1, y.unsqueeze(-1)).mean()

    device = "cuda" if CUDA else "cpu"
    chosen = "all" if policy == "all" else _FixedMixed({0: "recompute", 1: "host", 2: "selective"})
    got = train(make, batch, loss_fn, device=device,
                offload=lambda m: st.offload_activations(str(tmp_path / "act"), host_bytes=64 << 10, min_bytes=1024,
                                                         policy=chosen, layers=m))
    assert_matches(lambda: train(make, batch, loss_fn, device=device), got)
    assert len(got[2].layers) == 3
    assert got[2].report.offloaded_bytes > 0
    if policy == "mixed":
        assert set(got[2].report.layer_saves) == {1}, got[2].report.layer_saves
        assert all("forward" not in layer.__dict__ for layer in got[2].layers)


def test_adaptive_recompute_exact(tmp_path):
    """AdaptivePolicy(recompute=True) with no tier at all: what it cannot offload it may
    recompute; gradients stay exact and the layers come back unwrapped."""
    pol = st.AdaptivePolicy(profile_steps=1, max_overhead=10.0, recompute=True)
    ref = train(GPT, gpt_batch, gpt_loss, steps=4)
    got = train(GPT, gpt_batch, gpt_loss, steps=4,
                offload=lambda m: st.offload_activations(None, host_bytes=0, min_bytes=512, policy=pol, layers=m))
    assert_same(ref, got)
    off = got[2]
    assert {off.report.decisions[i] for i in range(3)} == {"recompute"}, off.report.decisions
    assert off.report.predicted["step_seconds"] > 0
    assert all("forward" not in layer.__dict__ for layer in off.layers)
    assert off.report.packed_bytes < off.reports[0].packed_bytes  # checkpointing saved less through the hooks


def test_gradient_accumulation_in_one_block(tmp_path):
    """Several forward/backward pairs in one block: each forward offloads, each backward prefetches."""
    def run(offload):
        torch.manual_seed(1)
        model = GPT()
        off = offload(model) if offload else None
        with (off if off is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            for step in range(3):
                x, y = gpt_batch(step, "cpu")
                gpt_loss(model(x), y).backward()
        return [p.grad.clone() for p in model.parameters()], off

    ref, _ = run(None)
    got, off = run(lambda m: st.offload_activations(tmp_path / "act", host_bytes=64 << 10, min_bytes=512,
                                                    policy="all", layers=m))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    r = off.report
    assert r.kept_reasons.get("last") == 3 and r.kept_reasons.get("backward", 0) == 0
    assert r.prefetch_hits > 0
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}


def _policy_with(profile, host_bytes, files, recompute=False, max_overhead=0.05):
    class Off:  # what _decide reads of an offloader
        pass
    off = Off()
    off.host_bytes, off.dir, off.prefetch_layers, off.copy_window = host_bytes, ("/x" if files else None), 1, 1
    pol = st.AdaptivePolicy(profile_steps=1, max_overhead=max_overhead, recompute=recompute)
    pol.profile = profile
    pol._decide(off)
    return pol


def _profile(n=8, fwd=0.010, nbytes=100 << 20, host_bw=50e9, ssd_bw=2e9):
    return {"fwd": [fwd] * n, "bwd": [2 * fwd] * n, "head": 0.002, "bytes": {i: nbytes for i in range(n)},
            "step_seconds": n * 3 * fwd + 0.002,
            "bandwidth": {"host_write": host_bw, "host_read": host_bw, "ssd_write": ssd_bw, "ssd_read": ssd_bw}}


def test_adaptive_model_decisions():
    # PCIe hides a layer's copy (2 ms) behind its 10 ms forward: all but the last layers go to the host tier
    pol = _policy_with(_profile(), host_bytes=1 << 40, files=False)
    assert set(pol.decisions.values()) == {"host"}
    assert pol.prediction["step_seconds"] <= _profile()["step_seconds"] * 1.05
    assert pol.prediction["memory_saved"] == 8 * (100 << 20)
    # no overhead allowed: the last layer (needed first in backward, its read cannot hide) stays
    pol = _policy_with(_profile(), host_bytes=1 << 40, files=False, max_overhead=0.0)
    assert pol.decisions[7] == "keep" and all(pol.decisions[i] == "host" for i in range(7)), pol.decisions
    assert pol.prediction["step_seconds"] == pytest.approx(_profile()["step_seconds"])
    # the host tier capped at two layers: the rest to the disk while it keeps up (50 ms a layer at 2 GB/s)
    pol = _policy_with(_profile(), host_bytes=200 << 20, files=True)
    assert sum(d == "host" for d in pol.decisions.values()) == 2
    assert all(d in ("host", "ssd", "keep") for d in pol.decisions.values())
    # the disk cannot hide a layer (50 ms against 30 ms of compute) and no host tier: parts of layers go,
    # at no modelled cost, never a whole one
    pol = _policy_with(_profile(), host_bytes=0, files=True, max_overhead=0.0)
    assert all(d in ("ssd", "keep") for d in pol.decisions.values()), pol.decisions
    assert all(0 < pol.fractions[i] < 1 for i, d in pol.decisions.items() if d == "ssd"), pol.fractions
    assert pol.prediction["step_seconds"] == pytest.approx(_profile()["step_seconds"])
    assert 0 < pol.prediction["memory_saved"] < 8 * (100 << 20)
    # recompute=True: what neither hides is recomputed while the budget allows (10 ms a layer, 24 ms budget)
    pol = _policy_with(_profile(), host_bytes=0, files=False, recompute=True, max_overhead=0.1)
    assert sum(d == "recompute" for d in pol.decisions.values()) == 2
    assert pol.prediction["step_seconds"] == pytest.approx(_profile()["step_seconds"] + 0.020)


def test_adaptive_model_inflight_bytes():
    """The model of inflight_bytes: copies stream while a layer runs; the bound makes forward wait for
    the copies beyond it, the head for all of them (the drain), and backward read the last layer."""
    pol = st.AdaptivePolicy(profile_steps=1)
    every = {i: "host" for i in range(4)}
    # h16384-like: a layer's copy (2 GiB at 54 GB/s, ~40 ms) as long as its forward
    pol.profile = _profile(n=4, fwd=0.040, nbytes=2 << 30, host_bw=54e9)
    loose, _ = pol.simulate(every, 1, 1)
    tight, _ = pol.simulate(every, 1, 1, inflight_bytes=1 << 30)
    # (the layer window's model starts a copy when the layer ends: more pessimistic than streaming)
    assert tight <= loose + 0.045, (loose, tight)
    # a link three times slower: the head waits for every copy (4 x 119 ms), then backward (240 ms) reads
    pol.profile = _profile(n=4, fwd=0.040, nbytes=2 << 30, host_bw=18e9)
    tight, _ = pol.simulate(every, 1, 1, inflight_bytes=256 << 20)
    copies = 4 * (2 << 30) / 18e9
    assert tight >= copies + 0.002 + 4 * 0.080, (tight, copies)
    # the policy decides with it (the offloader's inflight_bytes)
    class Off:
        pass
    off = Off()
    off.host_bytes, off.dir, off.prefetch_layers, off.copy_window, off.inflight_bytes = 1 << 40, None, 1, 1, 1 << 30
    pol = st.AdaptivePolicy(profile_steps=1, max_overhead=0.05)
    pol.profile = _profile(n=4, fwd=0.040, nbytes=2 << 30, host_bw=54e9)
    pol._decide(off)
    assert "host" in pol.decisions.values()
    assert pol.prediction["peak_saved"] == pol.prediction["memory_saved"]  # the drain: nothing in flight


def test_adaptive_moves_parts_of_layers():
    """Where a whole layer's copy outlasts its compute (the H100's h2048: ~1 GiB a layer, 20 ms
    on PCIe against ~3.5 ms of forward), the policy moves the part that hides instead of
    keeping everything, within its budget; the prediction says how much and what it costs."""
    prof = _profile(n=16, fwd=0.0035, nbytes=1 << 30, host_bw=54e9)
    pol = _policy_with(prof, host_bytes=1 << 40, files=False, max_overhead=0.03)
    host = [i for i, d in pol.decisions.items() if d == "host"]
    assert host and all(0 < pol.fractions[i] < 1 for i in host), (pol.decisions, pol.fractions)
    assert pol.prediction["step_seconds"] <= prof["step_seconds"] * 1.03 + 1e-9
    moved = pol.prediction["memory_saved"]
    # PCIe moves ~54 MB per ms: about the forward's 56 ms (and the budget) of copies, not more
    assert 1.5e9 < moved < 4.5e9, moved
    assert pol.prediction["peak_saved"] <= moved
    # the last layer stays (its read cannot hide: nothing starts it earlier than its own backward)
    assert pol.decisions[15] == "keep"


def grads_of(model, x, off):
    model.zero_grad(set_to_none=True)
    if off is None:
        model(x).square().sum().backward()
    else:
        with off:
            model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


class _FixedPolicy(st.AdaptivePolicy):
    """The adaptive policy with decisions given (no profile): what the offloader does with them."""

    def __init__(self, decisions, fractions=None, nbytes=None):
        super().__init__(profile_steps=0)
        self.decisions, self.fractions = dict(decisions), dict(fractions or {})
        self.profile = {"bytes": dict(nbytes or {})}

    def end_step(self, off, report, marks, seconds):
        pass


def test_offloaded_layer_then_kept_layers():
    """An offloaded layer followed by kept ones: all of its tensors go when the next layer
    begins (none is left pending until backward as the "last" one, none waits for a next
    store to be dropped), with exact gradients."""
    model = mlp(width=128, depth=4)
    x = torch.randn(64, 128)
    ref = grads_of(model, x, None)
    off = st.offload_activations(None, host_bytes=64 << 20, min_bytes=1024, layers=list(model)[:4],
                                 policy=_FixedPolicy({0: "host", 1: "keep", 2: "keep", 3: "keep"}))
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    r = off.report
    assert r.host_count == 2 and r.kept_reasons.get("last") is None, (r.summary(), r.kept_reasons)
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    off.close()


@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
def test_quota_moves_part_of_a_layer(tmp_path, setting):
    """A fraction of a layer's bytes (the adaptive policy's part): tensors in the order saved while
    they fit, the rest kept ("quota"); gradients exact."""
    model = mlp(width=128, depth=4)
    x = torch.randn(64, 128)
    ref = grads_of(model, x, None)
    s = dict(HOST_SETTINGS[setting])
    d = str(tmp_path / "act") if s.pop("files", False) else None
    per_layer = 2 * 64 * 128 * 4  # Linear's input and GELU's input, float32
    pol = _FixedPolicy({i: "host" for i in range(4)}, fractions={i: 0.5 for i in range(4)},
                       nbytes={i: per_layer for i in range(4)})
    pol.quota = lambda group: per_layer // 2  # no 1 MiB of slack at this size
    off = st.offload_activations(d, host_bytes=s["host_bytes"], min_bytes=1024, layers=list(model)[:4], policy=pol)
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    r = off.report
    assert r.kept_reasons.get("quota", 0) >= 3, r.kept_reasons
    assert r.offloaded_bytes + r.kept_bytes >= r.packed_bytes - r.deduped_bytes
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    off.close()


class _SaveViews(torch.autograd.Function):
    """Saves its extra arguments for backward (as attention saves q, k, v); returns x."""

    @staticmethod
    def forward(ctx, x, *saved):
        ctx.save_for_backward(*saved)
        return x * 1

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        return (g,) + tuple(None for _ in saved)


@needs_cuda
@pytest.mark.parametrize("gaps", [True, False])
def test_cuda_pack_does_not_block_host(gaps):
    """Storing a tensor enqueues its copy and returns: the host never waits for the GPU in
    forward, tensors with gaps included (before: a pageable staging copy, synchronous)."""
    b, t, h, heads = 4, 1024, 2048, 16
    x = torch.ones(8, device="cuda", requires_grad=True)
    off = st.offload_activations(None, host_bytes=4 << 30, min_bytes=1 << 20, policy="all")
    for step in range(2):  # the second is measured (pinned slabs allocated)
        torch.cuda.synchronize()
        with off:
            t0 = time.perf_counter()
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time ahead of the host
            y = x
            for _ in range(4):
                if gaps:
                    qkv = torch.empty(b, t, 3, heads, h // heads, dtype=torch.bfloat16, device="cuda")
                    views = qkv.permute(2, 0, 3, 1, 4).unbind(0)
                else:
                    views = [torch.empty(b, t, h, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
                y = _SaveViews.apply(y, *views)
            host_forward = time.perf_counter() - t0
            y.sum().backward()
        torch.cuda.synchronize()
    r = off.report
    assert r.host_bytes >= 8 * b * t * h * 2, r.summary()
    assert host_forward < 0.3, (host_forward, r.summary())
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    off.close()


def _cuda_gpt_step(model, x, off, set_to_none=True):
    """One step of the GPU tests' GPT (in `off`'s block where given): its activation peak (bytes
    above the step's start) and the gradients."""
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=set_to_none)
    gc.collect()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with (off if off is not None else contextlib.nullcontext()):
        gpt_loss(model(x), x).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, [p.grad.clone() for p in model.parameters()]


@needs_cuda
def test_cuda_offloaded_layer_then_kept_layers_lowers_peak():
    """Layer 0 to the host tier, the others kept: layer 0's memory is gone before the peak
    (before: held until backward, the peak unchanged)."""
    h, depth, t, b = 1024, 6, 512, 8
    torch.manual_seed(0)
    model = GPT(vocab=512, h=h, heads=8, depth=depth, ctx=t).cuda().to(torch.bfloat16)
    x = torch.randint(0, 512, (b, t), device="cuda")

    def peak(off):
        for _ in range(2):
            measured, _ = _cuda_gpt_step(model, x, off, set_to_none=False)
        return measured

    keep = peak(None)
    off = st.offload_activations(None, host_bytes=8 << 30, min_bytes=1 << 20, layers=model,
                                 policy=_FixedPolicy({0: "host", **{i: "keep" for i in range(1, depth)}}))
    got = peak(off)
    r = off.report
    assert r.host_bytes > 0 and r.kept_reasons.get("last") is None, (r.summary(), r.kept_reasons)
    assert got <= keep - 0.8 * r.host_bytes, (got, keep, r.host_bytes)
    off.close()


# -- memory-tight: inflight_bytes, read_ahead_bytes ----------------------------

class _FakeCopy:
    """A device-to-host copy that lands only when waited for (the host far ahead of the GPU)."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True


def _async_copies(off):
    """CPU copies made to look asynchronous: the originals stay held (copies in flight) until the
    offloader makes the compute wait for them, as on CUDA; all land at the step's end (where the
    offloader synchronizes the compute stream)."""
    inner, finish, made = off._copies.copy_out, off._finish_step, []

    def copy_out(e, pool):
        region = inner(e, pool)
        if region is not None and e.d2h_event is None:
            e.d2h_event = _FakeCopy()
            made.append(e.d2h_event)
            off._copies.inflight.append(e)
        return region

    def finish_step():
        for ev in made:
            ev.synchronize()
        made.clear()
        finish()
    off._copies.copy_out, off._finish_step = copy_out, finish_step
    return off


TIGHT = {"read_ahead": dict(read_ahead_bytes=0),
         "drain": dict(inflight_bytes=16 << 10, read_ahead_bytes=32 << 10)}


@pytest.mark.parametrize("setting", sorted(HOST_SETTINGS))
@pytest.mark.parametrize("tight", sorted(TIGHT))
@pytest.mark.parametrize("policy", ["all", "adaptive"])
def test_tight_bitwise(tmp_path, setting, tight, policy):
    """The memory-tight options change when tensors move, never what comes back."""
    ref = train(GPT, gpt_batch, gpt_loss)
    got = train(GPT, gpt_batch, gpt_loss, offloader(tmp_path, setting, policy, min_bytes=512, **TIGHT[tight]))
    assert_same(ref, got)
    r = got[2].report
    if policy == "all":
        assert r.offloaded_bytes > 0
        if tight == "drain":  # the head's tensors but the last are offloaded too
            assert r.kept_reasons.get("head") is None and r.kept_reasons.get("last") == 1, r.kept_reasons


@pytest.mark.parametrize("tight", sorted(TIGHT))
def test_tight_bitwise_async_copies(tight):
    """With copies in flight (forwarding, forced waits, the drain), gradients stay exact."""
    ref = train(GPT, gpt_batch, gpt_loss)
    got = train(GPT, gpt_batch, gpt_loss,
                lambda m: _async_copies(st.offload_activations(None, host_bytes=1 << 30, min_bytes=512, policy="all",
                                                               layers=m, **TIGHT[tight])))
    assert_same(ref, got)
    assert got[2].report.copy_waits > 0


@pytest.mark.parametrize("bound", [0, 48 << 10])
def test_tight_read_ahead_bound(tmp_path, bound):
    """read_ahead_bytes: reads replace what backward freed (once autograd dropped it), plus at most
    the bound; nothing stalls where layers follow one another. By default the layer ahead is read
    beside the one in use: a layer beyond what was freed."""
    make = lambda: mlp(depth=8)  # noqa: E731
    default = train(make, mlp_batch, mse, offloader(tmp_path, "host_ample"))[2].report
    got = train(make, mlp_batch, mse, offloader(tmp_path, "host_ample", read_ahead_bytes=bound))
    assert_same(train(make, mlp_batch, mse), got)
    r = got[2].report
    layer = max(r.layer_bytes[g] for g in r.layer_bytes if isinstance(g, int) and g >= 0)
    assert r.stalls == 0 and r.read_host_bytes > 2 * layer
    assert r.read_beyond_freed_peak_bytes <= bound, (r.read_beyond_freed_peak_bytes, bound)
    assert default.read_beyond_freed_peak_bytes > 0  # what the bound removes (0: the assertion above can fail)


def test_inflight_bound_with_async_copies():
    """inflight_bytes: the originals held for copies in flight never exceed the bound (the compute
    waits for the oldest), and backward begins with none of them (forward's end and the head drain);
    by default the last layer's originals are still held when backward begins."""
    bound = 24 << 10

    def run(**kw):
        return train(GPT, gpt_batch, gpt_loss,
                     lambda m: _async_copies(st.offload_activations(None, host_bytes=1 << 30, min_bytes=512,
                                                                    policy="all", layers=m, **kw)))
    default = run()[2].report
    got = run(inflight_bytes=bound, read_ahead_bytes=64 << 10)
    assert_same(train(GPT, gpt_batch, gpt_loss), got)
    r = got[2].report
    assert 0 < r.inflight_peak_bytes <= bound, (r.inflight_peak_bytes, bound)
    assert r.inflight_at_backward_bytes == 0
    assert default.inflight_peak_bytes > bound and default.inflight_at_backward_bytes > 0, (
        default.inflight_peak_bytes, default.inflight_at_backward_bytes)


def test_diagnosis_locates_the_peak():
    """diagnose: samples at forward's end, backward's start and around the peak (a fake allocator
    whose peak stops growing at the 10th hook call); JSON-serialisable."""
    import json
    calls = [0]

    def probe():
        calls[0] += 1
        return calls[0], min(calls[0], 10)

    def make(m):
        off = st.offload_activations(None, host_bytes=1 << 30, min_bytes=512, policy="all", layers=m,
                                     read_ahead_bytes=0)
        off.diagnose = True
        off._diagnosis.mem_probe = probe
        return off
    got = train(GPT, gpt_batch, gpt_loss, make, steps=1)
    d = got[2].report.diagnosis
    assert d["peak"] == 10 and [s["allocated"] for s in d["peak_between"]] == [9, 10], d["peak_between"]
    assert d["forward_end"]["phase"] == "forward" and d["backward_start"]["phase"] == "backward"
    for key in ("originals_held", "in_flight", "forwarded", "read_back_unused", "used_not_freed", "credit"):
        assert key in d["backward_start"]
    json.dumps(got[2].report.as_dict())


def test_tight_bad_arguments():
    for kw in (dict(inflight_bytes=-1), dict(read_ahead_bytes=-1)):
        with pytest.raises(ValueError):
            st.offload_activations(None, **kw)


# -- the mixed policy: keep, offload or recompute per layer under a budget ------------------------------

def _mixed_profile(n=8, fwd=0.0035, nbytes=int(1.06 * (1 << 30)), inputs=32 << 20, saves=40, per_save=20e-6,
                   host_bw=54e9, ssd_bw=2e9, head_bytes=int(1.75 * (1 << 30)), head=0.008, selective=None):
    """An H100 Llama at hidden 2048 as issue 43 measured it: 8 layers of ~1 GiB saved against
    3.5 ms of forward (their copies cannot hide), a 1.75 GiB head; the phases' peaks as keeping
    them all makes them. `selective`: (seconds, part of its bytes) selective checkpointing costs
    and frees per layer."""
    layer = [nbytes] * n
    sel = None if selective is None else {"seconds": [selective[0]] * n, "step_seconds": 0.0,
                                          "freed": {i: int(selective[1] * nbytes) for i in range(n)}}
    return {"selective": sel, "fwd": [fwd] * n, "bwd": [2 * fwd] * n, "head": head, "bytes": dict(enumerate(layer)),
            "saves": {i: saves for i in range(n)}, "regions": {i: saves // 4 for i in range(n)},
            "inputs": {i: inputs for i in range(n)},
            "step_seconds": n * 3 * fwd + head, "hook_seconds_per_save": per_save,
            "memory": {"head": sum(layer) + head_bytes, "measured": True,
                       "backward": {j: sum(layer[:j + 1]) + (256 << 20) for j in range(n)}},
            "bandwidth": {"host_write": host_bw, "host_read": host_bw, "ssd_write": ssd_bw, "ssd_read": ssd_bw}}


def _offloader_like(host_bytes, files):
    class Off:  # what the policy's model reads of an offloader
        pass
    off = Off()
    off.host_bytes, off.dir, off.prefetch_layers, off.copy_window = host_bytes, ("/x" if files else None), 1, 1
    off.inflight_bytes = off.read_ahead_bytes = None
    return off


def _mixed_with(profile, host_bytes=1 << 40, files=False, **budget):
    off = _offloader_like(host_bytes, files)
    pol = st.MixedPolicy(**budget)
    pol.profile = profile
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pol._decide(off)
    pol.caught = [str(w.message) for w in caught]
    pol._profiling = False  # as after its profile steps
    return pol


def _recompute_all(profile):
    """The model's gradient checkpointing: every layer recomputed."""
    return _mixed_with(profile, memory_budget=1)  # 1 byte: unreachable, so the least peak found


def test_mixed_frontier_dominates_checkpointing():
    """Issue 43's target in the model: at every memory budget from keep's peak down to gradient
    checkpointing's, the step at or below checkpointing's; the budget respected; a tighter budget
    never faster; at keep's peak, keep itself."""
    prof = _mixed_profile()
    keep = _mixed_with(prof, memory_budget=10 << 40)
    assert set(keep.decisions.values()) == {"keep"} and keep.hooked_layers() == frozenset()
    keep_peak, keep_step = keep.prediction["keep_peak_bytes"], keep.prediction["keep_step_seconds"]
    assert keep.prediction["step_seconds"] == pytest.approx(keep_step)
    every = _Plan({i: "recompute" for i in range(8)})  # gradient checkpointing: the inputs kept
    ckpt_step, ckpt_peak = keep._evaluate(every, _offloader_like(1 << 40, False))[:2]
    assert ckpt_step == pytest.approx(prof["step_seconds"] + sum(prof["fwd"]))  # a forward more per layer
    assert ckpt_peak < 0.5 * keep_peak
    # beyond it: the recomputed layers' inputs to the host tier (a copy of 32 MiB hides behind 3.5 ms)
    least = _mixed_with(prof, overhead_budget=10.0)
    assert least.prediction["peak_bytes"] < ckpt_peak and least.input_tiers, least.prediction
    assert least.prediction["step_seconds"] <= ckpt_step + 8 * 40e-6 + 0.001
    steps = []
    for k in range(0, 9):
        budget = int(keep_peak - (keep_peak - ckpt_peak) * k / 8)
        pol = _mixed_with(prof, memory_budget=budget)
        pred = pol.prediction
        assert pred["budget_met"] and pred["peak_bytes"] <= budget, (k, pred)
        assert pred["step_seconds"] <= ckpt_step + 1e-9, (k, pred, pol.decisions)
        steps.append(pred["step_seconds"])
        assert len(pol.plan) == 8 and {row["decision"] for row in pol.plan} <= {"keep", "host", "recompute"}
    assert steps == sorted(steps), steps
    assert steps[0] == pytest.approx(keep_step)
    # the recompute a layer costs: its forward, and the plan says which layers pay it
    pol = _mixed_with(prof, memory_budget=int(keep_peak - 2.5 * prof["bytes"][0]))
    rec = [row for row in pol.plan if row["decision"] == "recompute"]
    assert rec and all(row["added_seconds"] == pytest.approx(row["fwd_seconds"], rel=0.05) for row in rec)


def test_mixed_selective_checkpointing_beats_full():
    """Where selective checkpointing frees most of a layer for a fraction of its forward (norms,
    activations and rotary embeddings recomputed, matrix products kept: ~64% of a Llama layer at
    ~0.4 ms of 3.5), the frontier runs below gradient checkpointing's at every budget between, and at
    checkpointing's own memory it is no slower."""
    prof = _mixed_profile(selective=(0.0004, 0.64))
    keep = _mixed_with(prof, memory_budget=10 << 40)
    keep_peak = keep.prediction["keep_peak_bytes"]
    every = _Plan({i: "recompute" for i in range(8)})  # gradient checkpointing
    ckpt_step, ckpt_peak = keep._evaluate(every, _offloader_like(1 << 40, False))[:2]
    for k in range(1, 8):
        budget = int(keep_peak - (keep_peak - ckpt_peak) * k / 8)
        pol = _mixed_with(prof, memory_budget=budget)
        assert pol.prediction["peak_bytes"] <= budget and pol.prediction["step_seconds"] < ckpt_step, (k, pol.decisions)
        assert "selective" in pol.decisions.values(), (k, pol.decisions)
    half = _mixed_with(prof, memory_budget=int(keep_peak - 0.5 * (keep_peak - ckpt_peak)))
    assert half.prediction["step_seconds"] < prof["step_seconds"] + 0.5 * sum(prof["fwd"]), half.decisions
    at_ckpt = _mixed_with(prof, memory_budget=ckpt_peak)
    assert at_ckpt.prediction["budget_met"] and at_ckpt.prediction["step_seconds"] <= ckpt_step + 1e-4


def test_mixed_overhead_budget():
    """With an overhead budget: the most memory within it; nothing where nothing fits."""
    prof = _mixed_profile()
    pol = _mixed_with(prof, overhead_budget=0.03)
    pred = pol.prediction
    assert pred["step_seconds"] <= 1.03 * pred["keep_step_seconds"] + 1e-12
    # a layer's recompute (3.5 ms) is 4.2% of the 84 ms step: none fits; only what hides moves
    assert "recompute" not in pol.decisions.values(), pol.decisions
    pol = _mixed_with(prof, overhead_budget=0.10)  # two recomputes fit (7 ms of 8.4)
    assert list(pol.decisions.values()).count("recompute") == 2, pol.decisions
    assert pol.prediction["peak_bytes"] < pred["peak_bytes"]
    # the hooks cost what they measured: at 1 ms a saved tensor no layer is worth hooking
    pol = _mixed_with(_mixed_profile(per_save=1e-3), overhead_budget=0.03)
    assert pol.hooked_layers() == frozenset() and pol.prediction["hook_seconds"] == 0


def test_mixed_offloads_where_copies_hide():
    """Layers whose copies hide behind their compute (hidden 16384: a 2 GiB layer's copy about as long as
    its 40 ms forward) go to the host tier before any recompute: it costs less than a forward."""
    prof = _mixed_profile(fwd=0.040, nbytes=2 << 30, inputs=128 << 20, per_save=5e-6)
    keep_peak = _mixed_with(prof, memory_budget=10 << 40).prediction["keep_peak_bytes"]
    pol = _mixed_with(prof, memory_budget=int(0.75 * keep_peak))
    assert "host" in pol.decisions.values() and "recompute" not in pol.decisions.values(), pol.decisions
    assert pol.prediction["step_seconds"] < prof["step_seconds"] + prof["fwd"][0]
    # the memory-tight host tier: its part fits in host_bytes
    pol = _mixed_with(prof, host_bytes=3 << 30, memory_budget=int(0.75 * keep_peak))
    host = sum(prof["bytes"][i] * pol.fractions.get(i, 1.0) for i, d in pol.decisions.items() if d == "host")
    assert 0 < host <= 3 << 30


def test_mixed_calibrates_once_from_a_planned_step():
    """Where the second planned step is slower than predicted (the profile measured the hooks keeping,
    not storing), the excess becomes a cost per stored tensor and the plan is chosen again with it:
    fewer tensors stored, the prediction within the budget; a step as predicted changes nothing."""
    prof = _mixed_profile(fwd=0.040, nbytes=2 << 30, inputs=128 << 20, per_save=5e-6)
    pol = _mixed_with(prof, overhead_budget=0.03)
    off = _offloader_like(1 << 40, False)
    plan = _Plan({i: d for i, d in pol.decisions.items() if d != "keep"}, pol.fractions, pol.input_tiers)
    stored = plan.stored_tensors(pol.profile)
    assert stored > 0, pol.decisions
    before = dict(pol.decisions), pol.prediction["step_seconds"]

    class Report:
        host_count, ssd_count = int(stored), 0
    pol._calibrate(off, Report, before[1] + 0.001 * prof["step_seconds"])  # within 2%: noise
    assert pol.decisions == before[0] and pol.profile.get("store_seconds_per_tensor", 0.0) == 0
    pol._calibrate(off, Report, before[1] + 0.05 * prof["step_seconds"])  # 5% of keep more than predicted
    assert pol.profile["store_seconds_per_tensor"] == pytest.approx(0.05 * prof["step_seconds"] / int(stored))
    after = _Plan({i: d for i, d in pol.decisions.items() if d != "keep"}, pol.fractions, pol.input_tiers)
    assert after.stored_tensors(pol.profile) < stored, (before[0], pol.decisions)
    assert pol.prediction["step_seconds"] <= 1.03 * pol.prediction["keep_step_seconds"] + 1e-12
    assert pol.prediction["calibrated_from"]["residual_seconds"] == pytest.approx(0.05 * prof["step_seconds"])


class _PlannedStep:
    """What the policy reads of a planned step's report: tensors stored, the measured peak (if any)."""

    def __init__(self, stored=0, peak=None):
        self.host_count, self.ssd_count = stored, 0
        self.measured = {} if peak is None else {"peak_bytes": peak}


def _as_after_profile(pol, profile_steps=3):
    pol.profile_steps, pol._steps = profile_steps, profile_steps
    return pol


def test_mixed_replans_when_the_measured_peak_passes_the_budget():
    """The peak model ~5% low (the H100 run: h2048 at 5.84 GiB measured 5.90): the checked planned step
    (the calibration step, which measures the step's peak) passes the budget, so the plan is chosen
    again below the budget by the measured over predicted ratio, and the step after it is checked too;
    one that fits settles the plan."""
    prof = _mixed_profile()
    pol = _as_after_profile(_mixed_with(prof, memory_budget=0.6))
    off = _offloader_like(1 << 40, False)
    budget, first = pol.prediction["memory_budget"], dict(pol.prediction)
    assert first["budget_met"] and first["peak_bytes"] <= budget and first["peak_scale"] == 1.0
    assert not pol.wants_step_peak() and not pol.settled  # step 1 allocates the host tier: not checked
    pol.end_step(off, _PlannedStep(), [], first["step_seconds"])
    assert pol.wants_step_peak() and pol.prediction["replans"] == 0
    measured = 1.05 * budget
    pol.end_step(off, _PlannedStep(peak=measured), [], first["step_seconds"])
    assert pol.peak_scale == pytest.approx(measured / first["peak_bytes"])
    pred = pol.prediction
    assert pred["replans"] == 1 and pred["calibrated_from"]["measured_peak_bytes"] == int(measured)
    assert pred["peak_bytes"] * pol.peak_scale <= budget and pred["peak_bytes"] < first["peak_bytes"], pred
    assert pred["budget_met"] and pred["step_seconds"] >= first["step_seconds"]
    assert not pol.wants_step_peak() and not pol.settled  # the new plan is checked as the first was
    pol.end_step(off, _PlannedStep(), [], pred["step_seconds"])
    assert pol.wants_step_peak()
    pol.end_step(off, _PlannedStep(peak=pred["peak_bytes"] * pol.peak_scale), [], pred["step_seconds"])
    assert pol.settled and not pol.wants_step_peak() and pol.prediction["replans"] == 1
    # a peak above the prediction but within the budget changes nothing (its ratio is kept for later plans)
    pol = _as_after_profile(_mixed_with(prof, memory_budget=0.6))
    before, predicted = dict(pol.decisions), pol.prediction["peak_bytes"]
    assert predicted < budget
    within = (predicted + budget) / 2
    for peak in (None, within):
        pol.end_step(off, _PlannedStep(peak=peak), [], pol.prediction["step_seconds"])
    assert pol.decisions == before and pol.settled and pol.peak_scale == pytest.approx(within / predicted)


def test_mixed_backs_off_where_the_measured_step_passes_the_overhead_budget():
    """Selective recomputation measured dearer than its one profiled step said (the H100 run: h2048 at
    3% measured x1.078), by less than the 2% of keep that calibrates a plan within its prediction: past
    the overhead budget the excess is its cost anyway, and the plans back off (fewer layers changed)
    until the measured step fits; checks stop after ``max_replans``."""
    true_cost = 0.0006
    prof = _mixed_profile(selective=(0.0004, 0.64))
    pol = _as_after_profile(_mixed_with(prof, overhead_budget=0.03))
    off = _offloader_like(1 << 40, False)
    limit = 1.03 * pol.prediction["keep_step_seconds"]

    def changed():
        return [i for i, d in pol.decisions.items() if d != "keep"]

    def measured():  # the machine: each selectively recomputed layer costs true_cost
        assert set(pol.decisions.values()) <= {"keep", "selective"}, pol.decisions
        return pol.prediction["keep_step_seconds"] + true_cost * len(changed())

    first = changed()
    assert len(first) * 0.0004 <= 0.03 * pol.prediction["keep_step_seconds"] < len(first) * true_cost, first
    assert measured() - pol.prediction["step_seconds"] < 0.02 * pol.prediction["keep_step_seconds"]
    counts = [len(first)]
    for _ in range(pol.calibration_step * (1 + pol.max_replans)):
        if pol.settled:
            break
        pol.end_step(off, _PlannedStep(), [], measured())
        counts.append(len(changed()))
    assert pol.settled and measured() <= limit, (counts, pol.prediction)
    assert counts[-1] < counts[0] and counts == sorted(counts, reverse=True), counts
    assert pol.prediction["step_seconds"] == pytest.approx(measured())
    assert 0 < pol.prediction["replans"] <= pol.max_replans


def test_mixed_prefers_plain_checkpointing_at_its_memory():
    """At gradient checkpointing's own peak (the H100 run: rrrrrrRr, 2% slower than checkpointing: the
    offloader's overhead is not in the model), the plan is every layer checkpointed, no input offloaded,
    no hooks, where the model's peak for it misses the budget by no more than ``peak_tolerance``; below
    that, inputs are offloaded."""
    prof = _mixed_profile()
    keep = _mixed_with(prof, memory_budget=10 << 40)
    every = _Plan({i: "recompute" for i in range(8)})
    ckpt_step, ckpt_peak = keep._evaluate(every, _offloader_like(1 << 40, False))[:2]
    tolerance = keep.peak_tolerance * keep.prediction["keep_peak_bytes"]
    assert tolerance < prof["inputs"][0]  # an input offloaded would reach it: the model's own choice
    pol = _mixed_with(prof, memory_budget=int(ckpt_peak - tolerance / 2))
    assert set(pol.decisions.values()) == {"recompute"} and not pol.input_tiers, (pol.decisions, pol.input_tiers)
    assert pol.hooked_layers() == frozenset() and pol.prediction["budget_met"], pol.prediction
    assert pol.prediction["step_seconds"] == pytest.approx(ckpt_step) and not pol.caught
    pol = _mixed_with(prof, memory_budget=int(ckpt_peak - 2 * prof["inputs"][0]))
    assert len(pol.input_tiers) >= 2 and pol.prediction["budget_met"], (pol.decisions, pol.input_tiers)


def test_mixed_refuses_files_that_cannot_hide():
    """Files only (host_bytes=0) on a disk slower than the compute: the policy recomputes instead and
    says why it would not use the files; on a disk fast enough it uses them."""
    prof = _mixed_profile()
    keep_peak = _mixed_with(prof, memory_budget=10 << 40).prediction["keep_peak_bytes"]
    pol = _mixed_with(prof, host_bytes=0, files=True, memory_budget=int(0.6 * keep_peak))
    assert "recompute" in pol.decisions.values(), pol.decisions
    files = pol.prediction["files"]
    # the last layer's read cannot hide (nothing starts it before its own backward): refused, and why
    assert 7 in files["refused"] and "layer 7" in files["why"] and "pace" in files["why"], files
    assert all(pol.fractions[i] < 1 for i in files["used"]), (files, pol.fractions)
    t, _ = pol.simulate({i: "ssd" for i in files["used"]}, 1, 1, pol.fractions)
    assert t - pol._t_keep <= pol.hide_tolerance * 3 * 0.0035 * len(files["used"]) + 1e-9
    fast = _mixed_profile(fwd=0.040, nbytes=256 << 20, ssd_bw=50e9)
    pol = _mixed_with(fast, host_bytes=0, files=True, overhead_budget=0.03)
    assert "ssd" in pol.decisions.values(), pol.decisions
    # the whole step's disk traffic: the files hold what the model hides and no more
    t, _ = pol.simulate({i: d for i, d in pol.decisions.items() if d == "ssd"}, 1, 1, pol.fractions)
    assert t - pol._t_keep <= pol.hide_tolerance * 3 * 0.040 * 8 + 1e-9


def test_mixed_unreachable_budget_warns():
    pol = _mixed_with(_mixed_profile(), memory_budget=1 << 20)
    assert not pol.prediction["budget_met"]
    assert any("no plan reaches" in m for m in pol.caught), pol.caught
    assert set(pol.decisions.values()) == {"recompute"}  # the least memory it knows


def test_mixed_bad_arguments():
    for kw in (dict(memory_budget=0), dict(memory_budget=-1.0), dict(overhead_budget=-0.1), dict(profile_steps=1)):
        with pytest.raises(ValueError):
            st.MixedPolicy(**kw)
    assert st.MixedPolicy().overhead_budget == 0.03
    with pytest.raises(ValueError, match="layers"):
        with st.offload_activations(None, policy=st.MixedPolicy()):
            pass


class _FixedMixed(st.MixedPolicy):
    """The mixed policy with its plan given (no profile): what the offloader does with it."""

    def __init__(self, decisions, input_tiers=None):
        super().__init__(profile_steps=2)
        self._steps = 2
        self.decisions, self.input_tiers = dict(decisions), dict(input_tiers or {})
        self.profile = {"bytes": {}}

    def end_step(self, off, report, marks, seconds):
        self._steps += 1


def _checkpoint_saves_around(layer, x):
    """Tensors torch's non-reentrant checkpoint of `layer` saves through the saved-tensor hooks around it."""
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    return count


def test_mixed_plan_hooks_only_offloaded_layers(tmp_path):
    """A plan of keep, host and recompute: the saved-tensor hooks see only the offloaded layer's
    tensors, the recomputed layer runs under checkpointing and comes back unwrapped; exact."""
    model = mlp(width=128, depth=4)
    x = torch.randn(64, 128)
    ref = grads_of(model, x, None)
    layers = list(model)[:4]
    off = st.offload_activations(None, host_bytes=64 << 20, min_bytes=1024, layers=layers,
                                 policy=_FixedMixed({0: "recompute", 1: "host", 2: "keep", 3: "keep"}))
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    r = off.report
    assert r.saved_hooks and set(r.layer_saves) == {1}, r.layer_saves
    assert r.host_count == 2 and r.packed_count == 3, r.summary()  # Linear's input, GELU's; the weight
    assert all("forward" not in layer.__dict__ for layer in layers)
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    # a recomputed layer's input to the host tier: what the checkpoint saves as the layer begins is all
    # its hooks see (the checkpoint's own take the rest; torch 2.11 saves an empty placeholder beside
    # the input: counted here as this torch does it); the input alone stored, read back for the recomputation
    begins_with = _checkpoint_saves_around(layers[1], torch.randn(64, 128, requires_grad=True))
    assert begins_with in (1, 2)
    off = st.offload_activations(None, host_bytes=64 << 20, min_bytes=1024, layers=layers,
                                 policy=_FixedMixed({0: "keep", 1: "recompute", 2: "keep", 3: "keep"},
                                                    input_tiers={1: "host"}))
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    r = off.report
    assert r.layer_saves == {1: begins_with} and r.host_count == 1 and r.host_bytes == 64 * 128 * 4, (
        r.layer_saves, r.summary())
    assert r.read_host_bytes == r.host_bytes or r.forwarded_count == 1, r.summary()
    assert off.in_use() == {"host_bytes": 0, "files": [], "entries": 0}
    # selective checkpointing (matrix products kept, the rest recomputed) beside full: exact, unwrapped
    off = st.offload_activations(None, host_bytes=64 << 20, min_bytes=1024, layers=layers,
                                 policy=_FixedMixed({0: "selective", 1: "recompute", 2: "selective", 3: "keep"}))
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert not off.report.saved_hooks and all("forward" not in layer.__dict__ for layer in layers)
    # nothing offloaded: no hooks at all (not even the module hooks), still exact
    off = st.offload_activations(None, host_bytes=64 << 20, min_bytes=1024, layers=layers,
                                 policy=_FixedMixed({0: "recompute", 1: "keep", 2: "recompute", 3: "keep"}))
    got = grads_of(model, x, off)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert not off.report.saved_hooks and off.report.packed_count == 0
    assert all(not layer._forward_pre_hooks and not layer._forward_hooks for layer in layers)


@pytest.mark.parametrize("budget", [dict(memory_budget=0.6), dict(overhead_budget=0.5), dict(memory_budget=1)])
def test_mixed_policy_steps_exact(tmp_path, budget):
    """The whole policy on the CPU: profile (a step with the hooks, one timed without, one selective:
    the CPU's three, on a machine with a GPU too), plan, and steps that follow it with the gradients
    of keeping, bit for bit; the report says per layer what was chosen, and the predicted and
    measured step."""
    pol = st.MixedPolicy(**budget)
    ref = train(GPT, gpt_batch, gpt_loss, steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unreachable budget warns (tested above)
        got = train(GPT, gpt_batch, gpt_loss, steps=5,
                    offload=lambda m: st.offload_activations(str(tmp_path / "act"), host_bytes=1 << 20,
                                                             min_bytes=512, policy=pol, layers=m))
    assert_same(ref, got)
    off = got[2]
    assert pol.profile_steps == 3, "the layers run on the CPU: its profile, whatever the machine has"
    assert [r.policy for r in off.reports] == ["mixed:profile:hooked", "mixed:profile:timed",
                                               "mixed:profile:selective", "mixed", "mixed"]
    assert off.reports[0].saved_hooks and not off.reports[1].saved_hooks and not off.reports[2].saved_hooks
    assert pol.profile["selective"]["step_seconds"] > 0 and len(pol.profile["selective"]["seconds"]) == 3
    prof = pol.profile
    assert all(prof["bytes"][i] > 0 and prof["saves"][i] > 0 and prof["inputs"][i] > 0 for i in range(3)), prof
    r = off.report
    assert [row["layer"] for row in r.plan] == [0, 1, 2]
    assert {row["decision"] for row in r.plan} == set(r.decisions[i] for i in range(3))
    assert r.predicted["step_seconds"] > 0 and r.measured["step_seconds"] > 0
    assert r.predicted["peak_bytes"] <= r.predicted["keep_peak_bytes"]
    if budget.get("memory_budget") == 1:  # nothing but recompute reaches the least memory
        assert set(r.decisions[i] for i in range(3)) == {"recompute"}
    hooked = {i for i in range(3) if r.decisions[i] in ("host", "ssd")}
    assert set(r.layer_saves) == hooked and r.saved_hooks == bool(hooked)
    assert all("forward" not in layer.__dict__ for layer in off.layers)


def test_cuda_marks_only_for_layers_on_cuda(monkeypatch):
    """A CPU model in a process that has used CUDA (a test run on a GPU machine) is timed and
    sampled on the CPU: CUDA's allocator figures hold none of its memory (with them its profile
    saw a peak of nothing, and a memory budget chose to keep every layer)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    model = GPT()
    off = st.offload_activations(None, host_bytes=1 << 20, min_bytes=512, policy=st.MixedPolicy(memory_budget=0.5),
                                 layers=model)
    off._layer_hooks.begin_step()
    assert not off._layer_hooks.cuda_marks


def test_mixed_memory_profile_phases(monkeypatch):
    """The memory profile's phases as the layers' hooks sample them (forward and the head as the last
    layer's backward begins, then each layer's backward as the one below begins, the rest at the
    end), mapped to the head and to each layer's backward: their order checked against the figures
    of a probe that counts each sample."""
    samples = []

    class Counting:
        def memory_allocated(self):
            return 0

        def max_memory_allocated(self):
            samples.append(len(samples))
            return 1000 * len(samples)

        def reset_peak_memory_stats(self):
            pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, the layers on its CPU
    model = GPT()
    pol = st.MixedPolicy(memory_budget=0.5)
    off = st.offload_activations(None, host_bytes=1 << 20, min_bytes=512, policy=pol, layers=model)
    off._layer_hooks.memory_probe = Counting()
    x, y = gpt_batch(0, "cpu")
    for _ in range(3):
        with off:
            gpt_loss(model(x), y).backward()
    assert pol.profile_steps == 3 and off.reports[-1].policy == "mixed:profile:selective"
    mem = pol.profile["memory"]
    n = len(off.layers)
    # the timed step (the second) sampled n + 1 times (the memory profile's), then the selective one
    assert len(samples) == 2 * (n + 1) and not off.reports[0].memory_phases
    assert off.reports[1].memory_phases == [(n - 1 - k if k < n else "end", 1000 * (k + 1)) for k in range(n + 1)]
    assert mem["measured"] and mem["head"] == 1000, mem
    assert mem["backward"] == {n - k: 1000 * (k + 1) for k in range(1, n + 1)}, mem
    # the planned steps: the calibration step (the second) measures its peak over the step, the first not
    for _ in range(pol.calibration_step):
        with off:
            gpt_loss(model(x), y).backward()
    checked = off.reports[2 + pol.calibration_step].measured
    assert "peak_bytes" not in off.reports[3].measured and checked["peak_bytes"] == 1000 * len(samples), checked
    assert pol.prediction["calibrated_from"]["measured_peak_bytes"] == checked["peak_bytes"]


def test_files_that_cannot_keep_up_warn_once(tmp_path, monkeypatch):
    """A user forcing files (policy="all", host_bytes=0) where the disk sets the step's pace is told so,
    once, and the report says it; a disk that keeps up is not blamed."""
    model = GPT()
    x, y = gpt_batch(0, "cpu")
    off = st.offload_activations(str(tmp_path / "act"), host_bytes=0, min_bytes=512, policy="all", layers=model)
    monkeypatch.setattr(st._offload.policy.IoClock, "busy_seconds", lambda self: 1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with off:
            gpt_loss(model(x), y).backward()
    assert off.report.ssd_bytes > 0 and off.report.files_keep_up is True
    monkeypatch.setattr(st._offload.policy.IoClock, "busy_seconds", lambda self: 10.0)
    with pytest.warns(RuntimeWarning, match="could not keep up"):
        with off:
            gpt_loss(model(x), y).backward()
    assert off.report.files_keep_up is False and off.report.measured["disk_busy_seconds"] == 10.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with off:
            gpt_loss(model(x), y).backward()
    assert off.report.files_keep_up is False
    off.close()
    with st.offload_activations(None, host_bytes=1 << 20, min_bytes=512, policy="all", layers=model) as host_only:
        gpt_loss(model(x), y).backward()
    assert host_only.report.files_keep_up is None


@needs_cuda
@pytest.mark.parametrize("fraction", [0.7, 0.4])
def test_cuda_mixed_memory_budget(fraction):
    """On the GPU the mixed policy's plan keeps the measured activation peak within its memory budget
    (a fraction of keep's, which its profile measured), with the gradients of keeping (bf16, bitwise
    where keeping is reproducible), and predicts its peak within a tenth of keep's."""
    h, depth, t, b = 1024, 8, 512, 8
    torch.manual_seed(0)
    model = GPT(vocab=512, h=h, heads=8, depth=depth, ctx=t).cuda().to(torch.bfloat16)
    x = torch.randint(0, 512, (b, t), device="cuda")

    def step(off):
        return _cuda_gpt_step(model, x, off)

    for _ in range(2):
        keep_peak, keep_grads = step(None)
    pol = st.MixedPolicy(memory_budget=fraction)
    off = st.offload_activations(None, host_bytes=16 << 30, min_bytes=1 << 20, policy=pol, layers=model)
    for _ in range(pol.profile_steps or 4):
        step(off)
    for _ in range(pol.calibration_step * (1 + pol.max_replans)):  # each plan checked, chosen again where over
        if pol.settled:
            break
        step(off)
    assert pol.settled, off.report.predicted
    peak, grads = step(off)
    pred = off.report.predicted
    assert off.report.policy == "mixed" and pred["budget_met"], pred
    assert pred["keep_peak_bytes"] == pytest.approx(keep_peak, rel=0.05), (pred["keep_peak_bytes"], keep_peak)
    assert peak <= fraction * pred["keep_peak_bytes"] * 1.05, (peak, pred, off.report.decisions)
    assert abs(peak - pred["peak_bytes"]) <= 0.1 * keep_peak, (peak, pred)
    assert all(torch.equal(a, b) for a, b in zip(keep_grads, grads)) or not all(
        torch.equal(a, b) for a, b in zip(keep_grads, step(None)[1]))
    off.close()
