#!/usr/bin/env python3
"""The main job on a mounted volume: what a trainer gets from spillfs.

Run by tools/demo.sh (which mounts the default volume); by hand:

    PYTHONPATH=clients/python SPILLFS_CLIENT_LIB=build/lib/libspillfs_client.so \
        .venv/bin/python tools/demo.py /mnt/spill --spillfs build/bin/spillfs

1. Checkpoints: a model's state_dict and optimizer state saved with
   spillfs.save into the mount, read back by plain torch.load (bit for bit),
   then step 2's checkpoint of a fine-tune whose base is frozen: the volume
   maps the unchanged units by reference, and `spillfs stat` shows it.
2. Activations: training steps of a small transformer inside
   spillfs.torch.offload_activations, with the host tier too small for a
   step, so saved activations go to files in an ephemeral directory of the
   mount; the gradients equal those of the same steps without offloading.
3. Features: a node-feature table (.npy) on the mount gathered by
   spillfs.gnn.FeatureStore through its cache, equal to numpy's indexing of
   the same file, with the cache's hit counts.

Tensors are on the GPU where there is one, else on the CPU.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch

import spillfs


def stat(spillfs_bin, mount):
    out = subprocess.run([spillfs_bin, "stat", "--json", mount], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def mib(n):
    return f"{n / (1 << 20):,.1f} MiB"


def make_model(device):
    torch.manual_seed(0)
    base = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])
    head = torch.nn.Linear(1024, 16)
    return torch.nn.Sequential(base, head).to(device)


def checkpoint(model, opt, step):
    return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}


def as_bytes(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def same(a, b):
    """Bitwise equality of two nested checkpoint structures."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                and torch.equal(as_bytes(a), as_bytes(b)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def checkpoints(mount, spillfs_bin, device):
    print("== 1. checkpoints: spillfs.save into the mount, torch.load back, dedup of a fine-tune ==")
    workdir = os.path.join(mount, "demo")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    model = make_model(device)
    base, head = model[0], model[1]
    for p in base.parameters():
        p.requires_grad_(False)  # a fine-tune: the base is frozen, the head trains
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)

    def train_step():
        x = torch.randn(64, 1024, device=device)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    train_step()
    before = stat(spillfs_bin, mount)
    first = os.path.join(workdir, "ckpt-1.pt")
    ckpt1 = checkpoint(model, opt, 1)
    r1 = spillfs.save(ckpt1, first)
    after1 = stat(spillfs_bin, mount)
    print(f"spillfs.save  {first}: {mib(r1.file_bytes)} in {r1.seconds['total']:.3f} s "
          f"({r1.storages} storages, {r1.io_path or r1.backend}, written {mib(r1.bytes_written)}, "
          f"shared {mib(r1.bytes_shared)})")

    loaded = torch.load(first)  # each tensor back on the device it was saved from
    if not same(ckpt1, loaded):
        sys.exit("torch.load of the file spillfs.save wrote differs from what was saved")
    print(f"torch.load    {first}: identical to what was saved, bit for bit")

    train_step()  # only the head and the optimizer state change
    second = os.path.join(workdir, "ckpt-2.pt")
    ckpt2 = checkpoint(model, opt, 2)
    r2 = spillfs.save(ckpt2, second)
    after2 = stat(spillfs_bin, mount)
    print(f"spillfs.save  {second}: {mib(r2.file_bytes)} in {r2.seconds['total']:.3f} s "
          f"(written {mib(r2.bytes_written)}, shared {mib(r2.bytes_shared)} by reference)")
    if not same(ckpt2, spillfs.load(second)):
        sys.exit("spillfs.load of the second checkpoint differs from what was saved")
    print(f"spillfs.load  {second}: identical to what was saved")

    grew1 = after1["physical_bytes"] - before["physical_bytes"]
    grew2 = after2["physical_bytes"] - after1["physical_bytes"]
    print(f"spillfs stat: physical bytes +{mib(grew1)} for the first checkpoint, +{mib(grew2)} for the second; "
          f"referenced {mib(after2['referenced_bytes'])}, physical {mib(after2['physical_bytes'])}, "
          f"dedup ratio {after2['dedup_ratio']:.2f}")
    os.unlink(first)
    os.unlink(second)


def _library():
    from spillfs import _native
    _native.segment_io()
    return _native.library_path() or "absent (pure-Python I/O)"


def activations(mount, device):
    print("\n== 2. activations: spillfs.torch.offload_activations, files on the mount ==")
    import spillfs.torch

    act_dir = os.path.join(mount, "demo", "activations")
    os.makedirs(act_dir, exist_ok=True)
    os.setxattr(act_dir, "user.spillfs.ephemeral", b"1")  # deleted before flushed: no SSD I/O

    def model_and_data():
        torch.manual_seed(1)
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 4).to(device)
        x = torch.randn(4, 256, 256, device=device)
        return model, x

    def train(offload_dir=None, steps=3):
        model, x = model_and_data()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        offload = None
        if offload_dir is not None:
            # host tier 4 MiB: a step saves far more, so the rest goes to files
            offload = spillfs.torch.offload_activations(offload_dir, host_bytes=4 << 20, min_bytes=128 << 10,
                                                        policy="all", layers=list(model.layers))
        for _ in range(steps):
            if offload is None:
                model(x).square().mean().backward()
            else:
                with offload:
                    model(x).square().mean().backward()
                print("  " + offload.report.summary())
            opt.step()
            opt.zero_grad()
        if offload is not None:
            offload.close()
        return [p.detach().clone() for p in model.parameters()]

    want = train()
    got = train(act_dir)
    same = all(torch.equal(a, b) for a, b in zip(want, got))
    print(f"parameters after 3 steps equal, bit for bit, those trained without offloading: {same}; "
          f"files left in {act_dir}: {len(os.listdir(act_dir))}")
    if not same:
        sys.exit("offloaded training diverged from keeping the activations")


def features(mount, device):
    print("\n== 3. features: spillfs.gnn.FeatureStore over a .npy on the mount ==")
    import numpy as np
    from spillfs.gnn import FeatureStore

    path = os.path.join(mount, "demo", "features.npy")
    rows, width = 200_000, 128
    table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, width))
    for start in range(0, rows, 50_000):
        table[start:start + 50_000] = np.random.default_rng(start).standard_normal((50_000, width), np.float32)
    table.flush()
    del table
    reference = np.load(path, mmap_mode="r")
    rng = np.random.default_rng(7)
    with FeatureStore(path, device=device, host_bytes=16 << 20, gpu_cache_bytes=16 << 20, window=2) as store:
        t0 = time.monotonic()
        for _ in range(10):
            index = torch.from_numpy(rng.zipf(1.3, 4096) % rows)
            got = store.gather(index)
            if not np.array_equal(got.cpu().numpy(), reference[index.numpy()]):
                sys.exit("FeatureStore.gather differs from numpy indexing of the same file")
        seconds = time.monotonic() - t0
        stats = store.stats()
    print(f"{rows} x {width} float32 ({mib(rows * width * 4)}): 10 batches of 4096 skewed rows in {seconds:.2f} s, "
          f"equal to numpy's indexing")
    print(f"  hit rate {stats['hit_rate']:.2f} (GPU {stats['gpu_hits']}, host cache {stats['cache_hits']}, "
          f"hot {stats['hot_hits']}, victim {stats['victim_hits']}), {stats['storage_rows']} rows read from the SSD "
          f"in {stats['ssd_reads']} reads through {stats['backend']}")
    os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mount", help="a mounted spillfs volume")
    ap.add_argument("--spillfs", default="build/bin/spillfs", help="the spillfs command (for `spillfs stat`)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"spillfs {spillfs.__version__}, torch {torch.__version__}, tensors on {device}, "
          f"client library {_library()}")
    t0 = time.monotonic()
    checkpoints(args.mount, args.spillfs, device)
    activations(args.mount, device)
    features(args.mount, device)
    print(f"done in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
