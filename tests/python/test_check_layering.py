"""tools/check-layering.py: the daemon's layers include only what lies below them."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "check-layering.py")


def check(root):
    return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True)


def test_the_tree_keeps_the_layer_order():
    r = check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_include_of_a_layer_above_is_named(tmp_path):
    shutil.copytree(os.path.join(ROOT, "fs"), tmp_path / "fs")
    ram_tier = tmp_path / "fs" / "cache" / "ram_tier.cc"
    ram_tier.write_text('#include "core/filesystem.h"\n' + ram_tier.read_text())
    volume = tmp_path / "fs" / "include" / "spillfs" / "fs" / "volume.h"
    volume.write_text(volume.read_text() + '#include "spillfs/fs/inspector.h"\n')
    r = check(tmp_path)
    assert r.returncode == 1
    assert 'fs/cache/ram_tier.cc:1: includes "core/filesystem.h": core is not below cache' in r.stdout
    assert 'includes "spillfs/fs/inspector.h": inspect is not below store' in r.stdout
    assert "2 include(s) against the layer order" in r.stdout
