"""spillfs installed as a filesystem is: `cmake --install`, the mount helper, the .deb.

Environment (ctest sets both): SPILLFS_BUILD_DIR, the configured and built
tree; SPILLFS_BIN, its spillfs binary.

- test_install_*: `cmake --install` into a DESTDIR; the files are there and
  work from there (the command, the library through pkg-config and
  find_package, the Python package finding its library).
- test_mount_helper_*: mount.fuse.spillfs (the binary under that name) turns
  mount options into `spillfs mount` options, refuses unknown ones, and a
  plain umount then a remount keeps the data.
- test_deb_package: the .deb from cpack installed with dpkg: `mount -t
  fuse.spillfs`, an fstab line through `mount -T`, umount, remount, data
  intact, bad options refused; `dpkg -r` removes every file. Needs root and
  dpkg, and no spillfs package already installed (it would be removed).
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

BUILD = os.environ.get("SPILLFS_BUILD_DIR", "build")
SPILLFS_BIN = os.environ.get("SPILLFS_BIN", os.path.join(BUILD, "bin", "spillfs"))


# Tools that are not ours (cmake, cpack, dpkg, mount, cc...) run without the
# sanitizer runtime a sanitizer build preloads into the Python tests
# (SPILLFS_PYTEST_ENV): cpack deadlocked in setlocale under a preloaded libasan.
# What loads our libraries into an uninstrumented process (python3, the probe
# program) is given os.environ explicitly, preload included.
PLAIN_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def run(*args, check=True, env=None, **kw):
    return subprocess.run(list(args), check=check, capture_output=True, text=True,
                          env=PLAIN_ENV if env is None else env, **kw)


def stat_json(mnt):
    return json.loads(run(SPILLFS_BIN, "stat", "--json", mnt).stdout)


def needs_mount():
    if os.geteuid() != 0:
        pytest.skip("needs root (FUSE mounts)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")


@pytest.fixture(scope="module")
def destdir():
    """`cmake --install` of the build tree into a fresh DESTDIR under prefix /usr."""
    root = tempfile.mkdtemp(prefix="spillfs-install-")
    run("cmake", "--install", BUILD, "--prefix", "/usr", env=dict(PLAIN_ENV, DESTDIR=root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def find_one(root, name):
    hits = [os.path.join(d, name) for d, _, files in os.walk(root) if name in files]
    assert len(hits) == 1, f"{name}: {hits}"
    return hits[0]


def test_install_puts_the_command_helper_and_man_page_in_place(destdir):
    usr = os.path.join(destdir, "usr")
    spillfs = os.path.join(usr, "bin", "spillfs")
    assert run(spillfs, "--version").stdout.strip().startswith("spillfs ")
    helper = os.path.join(usr, "sbin", "mount.fuse.spillfs")
    assert os.path.islink(helper) and not os.path.isabs(os.readlink(helper))
    assert os.path.samefile(helper, spillfs)
    assert "usage: mount.fuse.spillfs" in run(helper, "--help").stdout
    man = open(os.path.join(usr, "share", "man", "man8", "spillfs.8")).read()
    for text in ("mount.fuse.spillfs", "ram_tier", "spillfs mkfs", "spillfs fsck", "spillfs stat"):
        assert text in man, text
    assert open(os.path.join(usr, "share", "man", "man8", "mount.fuse.spillfs.8")).read().startswith(".so ")


def test_install_python_package_finds_its_library(destdir):
    usr = os.path.join(destdir, "usr")
    site = os.path.join(usr, "lib", "python3", "dist-packages")
    library = find_one(usr, "libspillfs_client.so.0")
    env = {k: v for k, v in os.environ.items() if k not in ("SPILLFS_CLIENT_LIB", "PYTHONPATH")}
    env["PYTHONPATH"] = site
    probe = "import spillfs, spillfs._native as n; n.load_library(); print(spillfs.__file__); print(n.library_path())"
    out = run(sys.executable, "-c", probe, env=env, cwd="/").stdout.split("\n")
    assert out[0].startswith(site), out
    assert os.path.samefile(out[1], library), out


def test_install_library_through_pkg_config_and_find_package(destdir, tmp_path):
    usr = os.path.join(destdir, "usr")
    pc_dir = os.path.dirname(find_one(usr, "spillfs_client.pc"))
    flags = run("pkg-config", "--cflags", "--libs", "spillfs_client", env=dict(PLAIN_ENV,
                                                                               PKG_CONFIG_PATH=pc_dir)).stdout.split()
    source = tmp_path / "probe.c"
    source.write_text(
        textwrap.dedent("""\
        #include <spillfs/client.h>
        #include <stdio.h>
        int main(void) { printf("%s\\n", spill_version()); return 0; }
        """))
    lib_dir = os.path.dirname(find_one(usr, "libspillfs_client.so.0"))
    version = run(SPILLFS_BIN, "--version").stdout.split()[1]
    run("cc", str(source), "-o", str(tmp_path / "probe"), *flags)
    assert run(str(tmp_path / "probe"), env=dict(os.environ, LD_LIBRARY_PATH=lib_dir)).stdout.strip() == version

    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.20)
        project(probe C)
        find_package(spillfs REQUIRED)
        add_executable(probe ../probe.c)
        target_link_libraries(probe PRIVATE spillfs::spillfs_client)
        """))
    run("cmake", "-S", str(project), "-B", str(project / "build"), f"-DCMAKE_PREFIX_PATH={usr}")
    run("cmake", "--build", str(project / "build"))
    assert run(str(project / "build" / "probe"), env=dict(os.environ, LD_LIBRARY_PATH=lib_dir)).stdout.strip() == version


@pytest.fixture
def volume(tmp_path):
    """A fresh volume and an empty mountpoint; unmounted (and the daemon gone) after."""
    needs_mount()
    vol, mnt = str(tmp_path / "vol"), str(tmp_path / "mnt")
    os.mkdir(mnt)
    run(SPILLFS_BIN, "mkfs", vol, "--size", "1G")
    yield vol, mnt
    run(SPILLFS_BIN, "umount", mnt, check=False)


@pytest.fixture
def helper(tmp_path):
    """The spillfs binary under the helper's name (as the symlink installs it)."""
    path = tmp_path / "mount.fuse.spillfs"
    os.symlink(os.path.abspath(SPILLFS_BIN), path)
    return str(path)


def test_mount_helper_passes_options_and_survives_umount_remount(helper, volume):
    vol, mnt = volume
    run(helper, vol, mnt, "-o", "rw,defaults,_netdev,nofail,x-systemd.automount,ram_tier=64M,read_ahead=0,no_dedup,"
        "nosuid,nodev")
    stats = stat_json(mnt)
    assert stats["ram_tier_capacity_bytes"] == 64 << 20
    assert stats["read_ahead_window_bytes"] == 0
    options = [line.split() for line in open("/proc/self/mountinfo") if f" {mnt} " in line][0][5]
    assert "nosuid" in options and "nodev" in options, options
    data = os.urandom(3 << 20)
    with open(os.path.join(mnt, "kept"), "wb") as f:
        f.write(data)
    run("umount", mnt)  # plain umount: the daemon finishes on its own
    run(helper, vol, mnt, "-o", "ram_tier=32M")  # waits for the volume lock
    assert stat_json(mnt)["ram_tier_capacity_bytes"] == 32 << 20
    assert open(os.path.join(mnt, "kept"), "rb").read() == data


@pytest.mark.parametrize("options, message", [
    ("bogus=1", "unknown mount option 'bogus'"),
    ("ram_tier", "mount option 'ram_tier' needs a value"),
    ("no_dedup=1", "mount option 'no_dedup' takes no value"),
    ("help", "unknown mount option 'help'"),
    ("ram_tier=12Q", "--ram-tier"),
])
def test_mount_helper_refuses_bad_options_naming_them(helper, volume, options, message):
    vol, mnt = volume
    result = run(helper, vol, mnt, "-o", options, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert not any(f" {mnt} " in line for line in open("/proc/self/mountinfo"))


def test_mount_helper_sloppy_and_fake(helper, volume):
    vol, mnt = volume
    result = run(helper, vol, mnt, "-sf", "-o", "bogus=1,ram_tier=8M")
    assert result.returncode == 0 and "ignoring unknown mount option 'bogus'" in result.stderr
    assert not any(f" {mnt} " in line for line in open("/proc/self/mountinfo"))  # -f: no mount


def package_unavailable():
    if os.geteuid() != 0:
        return "needs root (dpkg -i)"
    for tool in ("dpkg", "cpack", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if run("dpkg-query", "-W", "-f=${Status}", "spillfs", check=False).stdout.startswith("install ok"):
        return "a spillfs package is installed already; this test would remove it"
    return None


def test_deb_package_installs_mounts_and_removes_cleanly(volume, tmp_path):
    reason = package_unavailable()
    if reason:
        pytest.skip(reason)
    vol, mnt = volume
    out = tmp_path / "deb"
    run("cpack", "--config", os.path.join(BUILD, "CPackConfig.cmake"), "-G", "DEB", "-B", str(out))
    debs = [p for p in os.listdir(out) if p.endswith(".deb")]
    assert len(debs) == 1, debs
    deb = str(out / debs[0])
    depends = run("dpkg-deb", "-f", deb, "Depends").stdout
    for dep in ("fuse3", "libfuse3", "liburing", "librocksdb"):
        assert dep in depends, depends
    with open("/tmp/spillfs-package-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one dpkg -i / dpkg -r at a time
        run("dpkg", "-i", deb)
        try:
            files = run("dpkg", "-L", "spillfs").stdout.split()
            for path in ("/usr/bin/spillfs", "/usr/sbin/mount.fuse.spillfs", "/usr/share/man/man8/spillfs.8",
                         "/usr/include/spillfs/client.h", "/usr/lib/python3/dist-packages/spillfs/__init__.py"):
                assert path in files, path
            run("mount", "-t", "fuse.spillfs", vol, mnt, "-o", "ram_tier=64M,_netdev")
            assert stat_json(mnt)["ram_tier_capacity_bytes"] == 64 << 20
            data = os.urandom(1 << 20)
            with open(os.path.join(mnt, "kept"), "wb") as f:
                f.write(data)
            bad = run("mount", "-t", "fuse.spillfs", vol, str(tmp_path), "-o", "bogus", check=False)
            assert bad.returncode != 0 and "bogus" in bad.stderr, bad.stderr
            run("umount", mnt)
            fstab = tmp_path / "fstab"
            fstab.write_text(f"{vol} {mnt} fuse.spillfs defaults,ram_tier=32M,_netdev 0 0\n")
            run("mount", "-T", str(fstab), mnt)
            assert stat_json(mnt)["ram_tier_capacity_bytes"] == 32 << 20
            assert open(os.path.join(mnt, "kept"), "rb").read() == data
            probe = "import spillfs._native as n; n.load_library(); print(n.library_path())"
            env = {k: v for k, v in os.environ.items() if k not in ("SPILLFS_CLIENT_LIB", "PYTHONPATH")}
            where = run("/usr/bin/python3", "-c", probe, env=env, cwd="/").stdout.strip()
            assert where.startswith("/usr/lib/python3/dist-packages/spillfs/lib/"), where
            run(SPILLFS_BIN, "umount", mnt)
        finally:
            run("umount", mnt, check=False)
            removed = run("dpkg", "-r", "spillfs", check=False)
        assert removed.returncode == 0, removed.stderr
        for path in files:
            if not os.path.isdir(path):
                assert not os.path.lexists(path), f"{path} left after dpkg -r"
