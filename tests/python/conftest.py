"""Shared by the Python tests: the package on sys.path, and a spillfs mount.

Environment: SPILLFS_BIN (the spillfs binary, default build/bin/spillfs) and
SPILLFS_CLIENT_LIB (libspillfs_client.so, default build/lib/...), as ctest
sets them. The `mount` fixture needs root, /dev/fuse and the binary, and
skips (saying which is missing) without them.
"""

import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

SPILLFS_BIN = os.environ.get("SPILLFS_BIN", os.path.join(ROOT, "build", "bin", "spillfs"))


def mount_unavailable():
    """Why no spillfs mount can be made here (None when one can)."""
    if os.geteuid() != 0:
        return "needs root"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    if not os.access(SPILLFS_BIN, os.X_OK):
        return f"no spillfs binary at {SPILLFS_BIN} (set SPILLFS_BIN)"
    return None


@pytest.fixture(scope="module")
def mount():
    """A fresh 1 GiB spillfs volume mounted for the test module; its mountpoint."""
    reason = mount_unavailable()
    if reason:
        pytest.skip(f"spillfs mount: {reason}")
    tmp = tempfile.mkdtemp(prefix="spillfs-pytest-")
    volume, mnt = os.path.join(tmp, "vol"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    subprocess.run([SPILLFS_BIN, "mkfs", volume, "--size", "1G"], check=True, capture_output=True)
    subprocess.run([SPILLFS_BIN, "mount", volume, mnt], check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run([SPILLFS_BIN, "umount", mnt], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", tmp], check=False)
