#!/usr/bin/env python3
"""spillfs.save / spillfs.load by a user who is not root (the daemon's memory I/O) and by root
(the direct path), against the raw disk, in one run; and the CPU time a save costs per GiB.

    python3 tools/bench/memory_io_bench.py --dir /root/miobench --json-out $OUT/memory_io.json

On a spillfs volume made under --dir and mounted by this script (allow_other), for a model-sized
state_dict (bf16, on CUDA where there is one; save_load_bench.py's shape):

* raw: O_DIRECT 1 MiB pwrite / pread from --qd threads on the disk of --dir (save_load_bench.py's);
* per user (root: the direct path; uid 65534: memory I/O, the bytes in a memfd the daemon maps):
  a first spillfs.save, a second with 1% of the bytes changed (dedup), and a cold spillfs.load
  (caches dropped, the volume remounted), each in a process of its own that times itself and
  reports its CPU time (getrusage) and the daemon's (/proc/PID/stat) over the call;
* root's save again with the setting device_hashes off (CUDA storages hashed on the CPU), for the
  CPU time per GiB of a CUDA save with and without GPU hashing.

Every load is checked bit for bit. Prints a row a measurement; --json-out writes them with their
ratios to raw. Needs root (mount, drop_caches, setuid).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from save_load_bench import Bench  # noqa: E402
from volume import sh  # noqa: E402

GIB = 1 << 30

# One measured call in a process of its own: argv = op, path, user, device, shape..., changed...
_CHILD = r"""
import json, os, resource, sys, time
import torch, spillfs
from spillfs import _native
sys.path.insert(0, sys.argv[1])
from save_load_bench import model_state_dict, one_percent_changed, check_equal
op, path, user, device, daemon = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
layers, hidden, intermediate, vocab = map(int, sys.argv[7:11])
settings = json.loads(sys.argv[11])
torch.manual_seed(0)
sd = model_state_dict(layers, hidden, intermediate, vocab, device)
nbytes = sum(t.numel() * t.element_size() for t in sd.values())
changed, _ = one_percent_changed(sd, nbytes)
if op == "second":
    for k in changed:
        sd[k].add_(1)
settings_fresh = settings.pop("fresh", 0)
if settings_fresh:  # bytes the volume holds nowhere (one set per value): every unit written and hashed
    for t in sd.values():
        t.add_(2.0 * settings_fresh + 1)
lib = _native.segment_io()  # loaded while the interpreter's files are readable
for key, value in settings.items():
    _native.check(lib.spill_config_set(key.encode(), value), "config", key)
getattr(torch.serialization, "get_crc32_options", lambda: None)()
if user != 0:
    os.setgroups([])
    os.setgid(user)
    os.setuid(user)
def daemon_cpu():
    with open(f"/proc/{daemon}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
if device == "cuda":
    torch.cuda.synchronize()
r0, d0, t0 = resource.getrusage(resource.RUSAGE_SELF), daemon_cpu(), time.perf_counter()
if op in ("first", "second"):
    report = spillfs.save(sd, path)
else:
    got = spillfs.load(path, map_location=device)
    if device == "cuda":
        torch.cuda.synchronize()
    report = spillfs.last_report()
seconds, r1, d1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF), daemon_cpu()
if op.startswith("load"):
    check_equal(sd, got, f"load by uid {user}")
print("RESULT " + json.dumps({"seconds": seconds, "bytes": nbytes,
      "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "daemon_cpu_seconds": d1 - d0,
      "io_path": report.io_path, "bytes_shared": report.bytes_shared,
      "io_bytes": report.io_stats.get("io_bytes") if report.io_stats else None}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--qd", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--spillfs", default=os.path.join(ROOT, "build", "bin", "spillfs"))
    ap.add_argument("--volume-size", default="48G")
    ap.add_argument("--users", default="0,65534", help="uids to measure, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="saves with device_hashes on and off, in turn")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="memory_io_bench.", dir=args.dir)
    os.chmod(work, 0o755)
    path = os.path.dirname(work)
    while path != "/":  # the other users reach the mount under it
        if not os.stat(path).st_mode & 0o001:
            raise SystemExit(f"memory_io_bench: {path} is not searchable by other users: give --dir elsewhere "
                             "(e.g. under /var/tmp)")
        path = os.path.dirname(path)
    bench = Bench(types.SimpleNamespace(dir=work, device=args.device, no_mount=True, qd=args.qd,
                                        no_drop_caches=False, stall_seconds=0))
    shape = [args.layers, args.hidden, args.intermediate, args.vocab]
    h, i = args.hidden, args.intermediate  # model_state_dict's bytes (bf16)
    nbytes = 2 * (2 * args.vocab * h + args.layers * (4 * h * h + 3 * i * h + 2 * h + h // 32) + h)
    bench.raw_io("state_dict", nbytes)
    image, mnt = os.path.join(work, "vol"), os.path.join(work, "mnt")
    os.makedirs(mnt)
    sh(args.spillfs, "mkfs", image, "--size", args.volume_size)

    daemon = [0]

    def mount():
        out = subprocess.run([args.spillfs, "mount", image, mnt, "-o", "allow_other"], check=True,
                             capture_output=True, text=True)
        daemon[0] = int(re.search(r"daemon pid (\d+)", out.stdout + out.stderr).group(1))

    mount()
    try:
        os.chmod(mnt, 0o777)

        def measure(op, path, user, settings=None, label=""):
            child = subprocess.run(
                [sys.executable, "-c", _CHILD, HERE, op, path, str(user), args.device, str(daemon[0]),
                 *map(str, shape), json.dumps(settings or {})],
                capture_output=True, text=True, cwd="/", env=dict(os.environ, HOME="/tmp"))
            lines = [x for x in child.stdout.splitlines() if x.startswith("RESULT ")]
            if child.returncode != 0 or not lines:
                raise SystemExit(f"memory_io_bench: {op} by uid {user} failed:\n{child.stdout}\n{child.stderr}")
            got = json.loads(lines[0][len("RESULT "):])
            gib = got["bytes"] / GIB
            extra = {"uid": user, "io_path": got["io_path"], "bytes_shared": got["bytes_shared"],
                     "io_bytes": got["io_bytes"], "cpu_s_per_GiB": round(got["cpu_seconds"] / gib, 3),
                     "daemon_cpu_s_per_GiB": round(got["daemon_cpu_seconds"] / gib, 3)}
            bench.add("state_dict", "mount", "save" if op in ("first", "second") else "load",
                      f"spillfs {op} uid {user}{label}", got["bytes"], got["seconds"], **extra)

        def cold():
            os.sync()
            sh(args.spillfs, "umount", mnt)
            mount()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")

        for k, user in enumerate(int(u) for u in args.users.split(",")):
            home = os.path.join(mnt, f"user{user}")
            os.mkdir(home)
            os.chown(home, user, user)
            first, second = os.path.join(home, "step1.pt"), os.path.join(home, "step2.pt")
            mine = {"fresh": 10 + k} if k else {}  # each user's own bytes: none shared across users
            measure("first", first, user, mine)
            measure("second", second, user, mine)
            cold()
            measure("load", first, user, mine)
        if args.device == "cuda":  # root's CUDA saves of new bytes hashed on the GPU, then on the CPU, in turn
            for j in range(args.repeat):
                measure("first", os.path.join(mnt, "user0", f"gpu_hashes{j}.pt"), 0, {"fresh": 1 + 2 * j},
                        " (new bytes)")
                measure("first", os.path.join(mnt, "user0", f"cpu_hashes{j}.pt"), 0,
                        {"fresh": 2 + 2 * j, "device_hashes": 0}, " (new bytes, device_hashes off)")
    finally:
        subprocess.run([args.spillfs, "umount", mnt], capture_output=True)
        if not os.path.ismount(mnt):  # rm -rf through a live mount would empty the volume
            shutil.rmtree(work, ignore_errors=True)
    result = {"torch": torch.__version__, "device": args.device,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "args": vars(args),
              "raw_GBps": {f"{k[0]} {k[1]}": round(v, 3) for k, v in bench.raw.items()}, "rows": bench.rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
