#!/usr/bin/env bash
# host_run.sh DIR [GIB]: measures, in one run on the filesystem holding DIR,
# the raw device path (dd O_DIRECT), the host filesystem (buffered + fsync),
# spillfs through the mount, torch.save/torch.load (host fs vs mount) and the
# activation pattern (write N files, read back in reverse, unlink) with the
# RAM tier large and capped small. Prints "name value unit" lines and JSON.
# Needs build/bin/spillfs (and LD_LIBRARY_PATH for carried libraries).
set -euo pipefail
dir=${1:?usage: host_run.sh DIR [GIB]}
gib=${2:-4}
spillfs=${SPILLFS:-$(dirname "$0")/../../build/bin/spillfs}
python=${PYTHON:-python3}
mkdir -p "$dir"
vol=$dir/vol mnt=$dir/mnt
results=()
note() { echo "$1 $2 $3"; results+=("\"$1\": $2"); }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'; }
bytes=$((gib << 30))
count=$((gib << 10))

# 1. raw: O_DIRECT 1 MiB sequential on the host filesystem (the limit here)
t=$(timed dd if=/dev/zero of="$dir/raw.bin" bs=1M count=$count oflag=direct conv=fsync)
note raw_write_MBps "$(mbps $bytes "$t")" MB/s
drop; t=$(timed dd if="$dir/raw.bin" of=/dev/null bs=1M iflag=direct)
note raw_read_MBps "$(mbps $bytes "$t")" MB/s
rm -f "$dir/raw.bin"
# 2. host filesystem, buffered 1 MiB with fsync
t=$(timed dd if=/dev/zero of="$dir/host.bin" bs=1M count=$count conv=fsync)
note host_buffered_write_MBps "$(mbps $bytes "$t")" MB/s
drop; t=$(timed dd if="$dir/host.bin" of=/dev/null bs=1M)
note host_buffered_read_MBps "$(mbps $bytes "$t")" MB/s
rm -f "$dir/host.bin"

# 3. spillfs through the mount
rm -rf "$vol"; mkdir -p "$mnt"
"$spillfs" mkfs "$vol" --size $((gib * 3 + 4))G >/dev/null
"$spillfs" mount "$vol" "$mnt" >/dev/null
t=$(timed dd if=/dev/zero of="$mnt/seq.bin" bs=1M count=$count conv=fsync)
note spillfs_write_MBps "$(mbps $bytes "$t")" MB/s
drop; t=$(timed dd if="$mnt/seq.bin" of=/dev/null bs=1M)
note spillfs_read_MBps "$(mbps $bytes "$t")" MB/s
rm -f "$mnt/seq.bin"

# 4. torch.save / torch.load of a 1 GiB tensor (CUDA when available)
if $python -c 'import torch' 2>/dev/null; then
  for target in host:"$dir" spillfs:"$mnt"; do
    name=${target%%:*} path=${target#*:}/t.pt
    out=$($python - "$path" <<'PY'
import os, sys, time, torch
path = sys.argv[1]
dev = "cuda" if torch.cuda.is_available() else "cpu"
t = torch.randn(1 << 28, device=dev)  # 1 GiB of float32
if dev == "cuda": torch.cuda.synchronize()
t0 = time.perf_counter()
with open(path, "wb") as f:
    torch.save(t, f); f.flush(); os.fsync(f.fileno())
t1 = time.perf_counter()
os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
t2 = time.perf_counter()
u = torch.load(path, map_location=dev)
if dev == "cuda": torch.cuda.synchronize()
t3 = time.perf_counter()
assert torch.equal(t, u)
os.unlink(path)
print(f"{(1 << 30) / (t1 - t0) / 1e9:.3f} {(1 << 30) / (t3 - t2) / 1e9:.3f} {dev}")
PY
)
    set -- $out
    note torch_save_${name}_GBps "$1" GB/s
    note torch_load_${name}_GBps "$2" GB/s
  done
fi

# 5. activation pattern: N files of 256 MiB in an ephemeral directory,
# read back in reverse, unlinked; SSD bytes from spillfs stat.
activation() {
  local label=$1 files=$2
  local before after
  before=$("$spillfs" stat --json "$mnt" | $python -c 'import json,sys; d=json.load(sys.stdin); print(d["bytes_written_ssd"], d["bytes_cancelled"])')
  local seconds
  seconds=$($python - "$mnt/act" "$files" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
os.setxattr(d, "user.spillfs.ephemeral", b"1")
block = bytes(range(256)) * (1 << 16)  # 16 MiB
t0 = time.perf_counter()
for i in range(n):  # forward pass: save activations
    with open(f"{d}/a{i}", "wb") as f:
        for _ in range(16): f.write(block)
for i in reversed(range(n)):  # backward pass: read in reverse, then drop
    with open(f"{d}/a{i}", "rb") as f:
        while f.read(1 << 24): pass
    os.unlink(f"{d}/a{i}")
print(f"{time.perf_counter() - t0:.2f}")
PY
)
  after=$("$spillfs" stat --json "$mnt" | $python -c 'import json,sys; d=json.load(sys.stdin); print(d["bytes_written_ssd"], d["bytes_cancelled"])')
  set -- $before $after
  note activation_${label}_seconds "$seconds" s
  note activation_${label}_ssd_bytes_written $(($3 - $1)) bytes
  note activation_${label}_bytes_cancelled $(($4 - $2)) bytes
}
activation large_tier 8
"$spillfs" umount "$mnt" >/dev/null
"$spillfs" mount "$vol" "$mnt" --ram-tier 64M >/dev/null
activation tier_64M 8
"$spillfs" umount "$mnt" >/dev/null
"$spillfs" fsck "$vol" >/dev/null && note fsck_clean 1 bool
rm -rf "$vol"
( IFS=,; echo "{${results[*]}}" ) > "${JSON_OUT:-/dev/null}"
