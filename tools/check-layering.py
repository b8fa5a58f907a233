#!/usr/bin/env python3
"""Checks that the daemon's layers include only what lies below them.

Usage: tools/check-layering.py [REPO_ROOT]      (ctest runs it: test "layering")

fs/CMakeLists.txt makes each layer a target that links only the layers below it, but
every layer sees the whole of fs/ on its include path, so a header of a layer above
(say "core/filesystem.h" from cache/) would compile. This check closes that gap: every
`#include "..."` of a source or header under fs/LAYER/ must name its own layer, a layer
below it, a public header (fs/include/spillfs/fs/) of such a layer, or the layers every
one uses (spillfs/common, spillfs/kvindex). Prints each include that breaks the rule,
with its file and line, and exits 1; exits 0 when there is none.

The order, bottom first (fs/CMakeLists.txt says what each layer is):
  store < cache < core < control < fuse, and store < inspect < control.
"""

import os
import re
import sys

# Layer -> the layers it may include (itself included).
ALLOWED = {
    "store": {"store"},
    "cache": {"cache", "store"},
    "core": {"core", "cache", "store"},
    "inspect": {"inspect", "store"},
    "control": {"control", "core", "cache", "store", "inspect"},
    "fuse": {"fuse", "control", "core", "cache", "store", "inspect"},
}
# The public headers of fs/include/spillfs/fs/ and the layer each belongs to.
PUBLIC = {
    "spillfs/fs/volume.h": "store",
    "spillfs/fs/inspector.h": "inspect",
    "spillfs/fs/fsck.h": "inspect",
    "spillfs/fs/fuse_daemon.h": "fuse",
}
SHARED_PREFIXES = ("spillfs/common/", "spillfs/kvindex/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of_include(name):
    """The layer an include names, None for a shared one, or "?" for one no layer owns."""
    if name.startswith(SHARED_PREFIXES):
        return None
    if name in PUBLIC:
        return PUBLIC[name]
    head = name.split("/", 1)[0]
    return head if head in ALLOWED else "?"


def violations(root):
    fs = os.path.join(root, "fs")
    found = []
    for layer in sorted(ALLOWED):
        for folder, _, files in os.walk(os.path.join(fs, layer)):
            for file in sorted(files):
                if not file.endswith((".h", ".cc")):
                    continue
                path = os.path.join(folder, file)
                with open(path, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = layer_of_include(m.group(1))
                        if target is None or target in ALLOWED[layer]:
                            continue
                        why = "no layer owns it" if target == "?" else f"{target} is not below {layer}"
                        found.append(f"{os.path.relpath(path, root)}:{number}: includes \"{m.group(1)}\": {why}")
    # The public headers obey their own layer's rule.
    for name, layer in sorted(PUBLIC.items()):
        path = os.path.join(fs, "include", name)
        if not os.path.exists(path):
            found.append(f"fs/include/{name}: listed as {layer}'s public header but missing")
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                target = layer_of_include(m.group(1)) if m else None
                if target is not None and target not in ALLOWED[layer]:
                    found.append(f"fs/include/{name}:{number}: includes \"{m.group(1)}\": {target} is not below {layer}")
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(root, "fs")):
        print(f"check-layering: no fs/ under {root}", file=sys.stderr)
        return 2
    found = violations(root)
    for line in found:
        print(line)
    if found:
        print(f"check-layering: {len(found)} include(s) against the layer order (tools/check-layering.py)")
        return 1
    print("check-layering: every include under fs/ names its own layer or one below")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
