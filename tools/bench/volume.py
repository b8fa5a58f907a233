"""A spillfs volume made and mounted for one benchmark run, for the scripts in
tools/bench (each runs as a script, so this folder is on its sys.path):

    from volume import Volume
    vol = Volume("build/bin/spillfs", work, "48G")  # mkfs work/vol, mounted on work/mnt
    ...
    if vol.close():  # unmounted: only now may work be removed
        shutil.rmtree(work)

Every command's failure raises subprocess.CalledProcessError (or RuntimeError
for an unmount), except in close(), which never raises.
"""

import json
import os
import subprocess


def sh(*args):
    """Runs a command; its standard output (CalledProcessError on failure)."""
    return subprocess.run(list(args), check=True, capture_output=True, text=True).stdout


class Volume:
    def __init__(self, spillfs_bin, work, size, mkfs_args=()):
        self.bin, self.image, self.mnt = spillfs_bin, os.path.join(work, "vol"), os.path.join(work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        sh(self.bin, "mkfs", self.image, "--size", str(size), *mkfs_args)
        self.mount()

    def mount(self):
        sh(self.bin, "mount", self.image, self.mnt)

    def umount(self, check=True):
        done = subprocess.run([self.bin, "umount", self.mnt], capture_output=True, text=True)
        if check and done.returncode != 0:  # a mount over a mounted volume would wait for its lock, then fail
            raise RuntimeError(f"spillfs umount {self.mnt}: {done.stderr.strip() or done.stdout.strip()}")

    def stat(self):
        """`spillfs stat --json` of the mount."""
        return json.loads(sh(self.bin, "stat", "--json", self.mnt))

    def close(self):
        """Unmounts, never raising. True when nothing is mounted there any more:
        only then may the work directory be removed (rm -rf through a live mount
        would empty the volume; through a hung one it would hang)."""
        self.umount(check=False)
        return not os.path.ismount(self.mnt)
