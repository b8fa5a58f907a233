"""Crash safety of spillfs.save on a real spillfs mount: kill -9 of the saving
process, and of the daemon, at seeded moments of a save.

Run: .venv/bin/python -m pytest -q tests/python/test_checkpoint_crash.py
Needs root, /dev/fuse and SPILLFS_BIN (a volume of its own, mounted here so
its daemon can be killed and the volume mounted again); skips without them.

The saver is crash_saver.py, a process of its own. After each kill the path
holds a whole checkpoint, bit for bit: the previous one, or (the rename done)
the new one; nothing else is under the final name. Temporary files
``.<name>.<random>.spillfs-tmp`` of killed saves stay: nothing removes them
(a later save makes a new one; remove them by hand or by a job's start-up).
"""

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import SPILLFS_BIN, mount_unavailable  # noqa: E402
from crash_saver import state  # noqa: E402
from test_serialization import assert_same  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SAVER = os.path.join(HERE, "crash_saver.py")
NAME = "ckpt.pt"
TMP_NAME = re.compile(r"^\." + re.escape(NAME) + r"\..+\.spillfs-tmp$")


class Volume:
    """A spillfs volume mounted by this test, its daemon's pid known."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="spillfs-crash-")
        self.volume, self.mnt = os.path.join(self.tmp, "vol"), os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        subprocess.run([SPILLFS_BIN, "mkfs", self.volume, "--size", "1G"], check=True, capture_output=True)
        self.pid = None
        self.mount()

    def mount(self):
        out = subprocess.run([SPILLFS_BIN, "mount", self.volume, self.mnt], check=True, capture_output=True,
                             text=True)
        self.pid = int(re.search(r"daemon pid (\d+)", out.stdout + out.stderr).group(1))

    def kill_daemon(self):
        os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def remount(self):
        """After kill_daemon: the dead mount detached, the volume mounted again."""
        subprocess.run(["umount", "-l", self.mnt], check=False, capture_output=True)
        self.mount()

    def close(self):
        if self.pid is not None:
            subprocess.run([SPILLFS_BIN, "umount", self.mnt], check=False, capture_output=True)
        else:
            subprocess.run(["umount", "-l", self.mnt], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", self.tmp], check=False)


@pytest.fixture(scope="module")
def volume():
    reason = mount_unavailable()
    if reason:
        pytest.skip(f"spillfs mount: {reason}")
    v = Volume()
    try:
        yield v
    finally:
        v.close()


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"),
                                         env.get("PYTHONPATH", "")])
    return env


def _saver(path, generation, *args):
    return subprocess.Popen([sys.executable, SAVER, path, str(generation), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def _save_whole(path, generation):
    """A save that runs to its end; its seconds."""
    p = _saver(path, generation)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return float(out.split("saved")[1])


def _kill_at(path, generation, delay, kill):
    """Starts a save, calls kill() `delay` seconds after its call began; the
    saver's end (killed, or failed where the daemon died)."""
    p = _saver(path, generation)
    assert p.stdout.readline().strip() == "saving", p.stderr.read()
    time.sleep(delay)
    kill()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if p.poll() is None:
        p.kill()  # ours, by its pid
        p.wait(timeout=30)
    p.stdout.close()
    p.stderr.close()
    return p.returncode


def _check(directory, allowed):
    """The checkpoint under NAME is one of the `allowed` generations, whole
    and bit for bit; nothing but temporary files beside it. Its generation,
    and the temporary files."""
    names = os.listdir(directory)
    assert NAME in names, names
    others = [n for n in names if n != NAME]
    assert all(TMP_NAME.match(n) for n in others), others
    got = torch.load(os.path.join(directory, NAME))
    assert got["generation"] in allowed, (got["generation"], allowed)
    assert_same(state(got["generation"]), got)
    return got["generation"], others


def test_kill_9_of_the_saver_keeps_the_previous_checkpoint(volume):
    directory = os.path.join(volume.mnt, "saver")
    os.mkdir(directory)
    path = os.path.join(directory, NAME)
    _save_whole(path, 0)  # writes every unit
    # The time of a save like those killed below (half its units shared with the file before: each
    # generation's even tensors are the same), not of the first, which writes twice as much.
    seconds = _save_whole(path, 1)
    current, generation, killed_mid_save = 1, 1, 0
    rng = random.Random(20240607)  # seeded moments within the save's time
    # Timed kills may land before or after the save's writes (the saver's start-up varies); the
    # hooks at the first write call, before and after it is issued, land inside it for sure.
    cases = [("at", rng.uniform(0.05, 0.95)) for _ in range(3)] + [("background", rng.uniform(0.05, 0.95)),
                                                                    ("hook", "mid-write:1"),
                                                                    ("hook", "after-write:1"),
                                                                    ("hook", "before-rename"),
                                                                    ("hook", "after-rename")]
    for kind, moment in cases:
        generation += 1
        if kind in ("at", "background"):  # background: the writer thread's save killed
            p = _saver(path, generation, *(["--background"] if kind == "background" else []))
            assert p.stdout.readline().strip() == "saving"
            time.sleep(moment * seconds)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
            finished = "saved" in p.stdout.read()
            p.stdout.close(), p.stderr.close()
            got, tmps = _check(directory, {current, generation})
            print(f"{kind}: saver killed at {moment:.3f} of {seconds:.3f} s: generation {got} at the path, {len(tmps)} tmp")
            if not finished and got == current:
                killed_mid_save += 1
                assert tmps, f"moment {moment:.3f} of {seconds:.3f} s: killed mid-save, no temporary file left"
        else:
            p = _saver(path, generation, "--hook", moment)
            p.communicate(timeout=120)
            assert p.returncode == -signal.SIGKILL
            got, tmps = _check(directory, {current, generation})
            # mid-write and before the rename: the old file; after it: the new one, whole (fsync'ed before)
            assert got == (generation if moment == "after-rename" else current), (moment, got)
            if moment.endswith("-write:1"):
                killed_mid_save += 1
                assert tmps, f"{moment}: killed mid-save, no temporary file left"
        current = got
    assert killed_mid_save >= 2, f"only {killed_mid_save} kills landed mid-save (save: {seconds:.3f} s)"
    # a later save goes through; the temporary files of the killed ones stay
    _save_whole(path, generation + 1)
    assert _check(directory, {generation + 1})[1]


def test_kill_9_of_the_daemon_keeps_the_previous_checkpoint(volume):
    directory = os.path.join(volume.mnt, "daemon")
    os.mkdir(directory)
    path = os.path.join(directory, NAME)
    seconds = _save_whole(path, 0)
    current, interrupted = 0, 0
    rng = random.Random(7)
    # Timed kills, and kills by the saver at its first write call, before and after it is issued
    # (surely mid-save: how many write calls follow depends on what dedup shares).
    moments = [rng.uniform(0.05, 0.95) for _ in range(3)] + ["mid-write:1", "after-write:1"]
    for generation, moment in enumerate(moments, start=1):
        if isinstance(moment, str):
            p = _saver(path, generation, "--hook", moment, "--victim", str(volume.pid))
            p.communicate(timeout=120)
            rc, volume.pid = p.returncode, None
            assert rc != 0, f"{moment}: the save succeeded with its daemon killed under it"
            when = moment
        else:
            rc = _kill_at(path, generation, moment * seconds, volume.kill_daemon)
            when = f"{moment:.3f} of {seconds:.3f} s"
        interrupted += rc != 0  # the save failed or was killed: the daemon died under it
        volume.remount()
        got, _ = _check(directory, {current, generation})
        print(f"daemon killed at {when}: saver rc {rc}, generation {got} at the path")
        current = got
    assert interrupted >= 2, f"only {interrupted} daemon kills landed mid-save (save: {seconds:.3f} s)"
    _save_whole(path, 9)  # the volume takes saves again
    _check(directory, {9})
