// Permission checks on a mounted spillfs volume, as ext4 makes them. The tests
// run as root, which bypasses permission checks, so each check runs in a
// forked child that has dropped to uid/gid 65534 (nobody/nogroup) with no
// supplementary groups. The volume is mounted with -o allow_other, without
// which FUSE lets no other user in at all.
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "support/errno_names.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"
#include "support/shared_volume.h"

namespace spillfs::testing {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

// The result of a system call: 0 on success, errno on failure.
int Err(long rc) { return rc < 0 ? errno : 0; }

int OpenCloseErr(const std::string& path, int flags, mode_t mode = 0644) {
  int fd = open(path.c_str(), flags, mode);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

constexpr int kChildSetupFailed = -1;
constexpr int kChildDied = -2;

// Runs FN in a child process as uid 65534, gid 65534, no supplementary groups,
// and returns what FN returned (an errno value, 0 for success), or a negative
// value when the child could not drop privileges or died.
int AsNobody(const std::function<int()>& fn) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return kChildDied;
  pid_t pid = fork();
  if (pid < 0) return kChildDied;
  if (pid == 0) {
    close(pipe_fds[0]);
    int result = kChildSetupFailed;
    if (setgroups(0, nullptr) == 0 && setgid(kNogroup) == 0 && setuid(kNobody) == 0) {
      umask(0);
      result = fn();
    }
    ssize_t ignored = write(pipe_fds[1], &result, sizeof result);
    (void)ignored;
    _exit(0);
  }
  close(pipe_fds[1]);
  int result = kChildDied;
  if (read(pipe_fds[0], &result, sizeof result) != sizeof result) result = kChildDied;
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return result;
}

#define EXPECT_AS_NOBODY(expected, call)                                                                     \
  do {                                                                                                       \
    int err_ = AsNobody([&]() -> int { return (call); });                                                    \
    EXPECT_EQ(err_, (expected)) << "as uid 65534: " << #call << " gave " << ErrnoName(err_) << ", expected " \
                                << ErrnoName(expected);                                                      \
  } while (0)

// Like support's WriteFile, and then chmod: the mode is exact even where the
// file existed.
void WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, mode);
  ASSERT_GE(fd, 0) << "create " << path << ": " << ErrnoName(errno);
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(close(fd), 0);
  ASSERT_EQ(chmod(path.c_str(), mode), 0);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// Lets other users reach PATH: mkdtemp makes the directory above the
// mountpoint 0700.
void MakeParentTraversable(const std::string& mountpoint) {
  std::string copy = mountpoint;
  std::string parent = dirname(copy.data());
  ASSERT_EQ(chmod(parent.c_str(), 0755), 0) << parent << ": " << ErrnoName(errno);
}

class PermissionsTest : public SharedVolumeTest {
 protected:
  static void SetUpTestSuite() {
    MountedVolume::Options options;
    options.mount_options = "allow_other";
    MountSharedVolume(options);
  }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(SharedVolumeTest::SetUp());
    MakeParentTraversable(volume_->mountpoint());
    ASSERT_EQ(chmod(volume_->mountpoint().c_str(), 0755), 0) << ErrnoName(errno);
    // The child must be able to work at all: this is the control for every
    // denial below.
    ASSERT_EQ(AsNobody([&] { return Err(access(dir_.c_str(), R_OK | X_OK)); }), 0)
        << "uid 65534 cannot reach the test directory";
  }
};

TEST_F(PermissionsTest, ReadingAnOwnerOnlyRootFileIsDenied) {
  WriteFile(P("secret"), "secret", 0600);
  WriteFile(P("public"), "public", 0604);
  const std::string secret = P("secret");
  const std::string pub = P("public");
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(secret, O_RDONLY));
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(secret, O_WRONLY));
  EXPECT_AS_NOBODY(EACCES, Err(access(secret.c_str(), R_OK)));
  EXPECT_AS_NOBODY(0, Err(access(secret.c_str(), F_OK)));
  // Controls: stat needs no permission on the file, and "other" read works.
  EXPECT_AS_NOBODY(0, [&] {
    struct stat st {};
    return Err(stat(secret.c_str(), &st));
  }());
  EXPECT_AS_NOBODY(0, OpenCloseErr(pub, O_RDONLY));
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(pub, O_WRONLY));
  EXPECT_AS_NOBODY(0, [&] {
    int fd = open(pub.c_str(), O_RDONLY);
    if (fd < 0) return errno;
    char buf[16];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n == 6 && memcmp(buf, "public", 6) == 0 ? 0 : EIO;
  }());
  // Root is not affected.
  EXPECT_EQ(ReadFile(secret), "secret");
}

TEST_F(PermissionsTest, CreatingInAnotherUsersDirectoryIsDenied) {
  // dir_ is root's, 0755.
  WriteFile(P("rootfile"), "x", 0666);
  ASSERT_EQ(mkdir(P("rootdir").c_str(), 0777), 0);
  const std::string d = dir_;
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(d + "/new", O_CREAT | O_WRONLY));
  EXPECT_AS_NOBODY(EACCES, Err(mkdir((d + "/newdir").c_str(), 0755)));
  EXPECT_AS_NOBODY(EACCES, Err(symlink("x", (d + "/newlink").c_str())));
  EXPECT_AS_NOBODY(EACCES, Err(mknod((d + "/fifo").c_str(), S_IFIFO | 0644, 0)));
  EXPECT_AS_NOBODY(EACCES, Err(link((d + "/rootfile").c_str(), (d + "/hard").c_str())));
  EXPECT_AS_NOBODY(EACCES, Err(unlink((d + "/rootfile").c_str())));
  EXPECT_AS_NOBODY(EACCES, Err(rmdir((d + "/rootdir").c_str())));
  EXPECT_AS_NOBODY(EACCES, Err(rename((d + "/rootfile").c_str(), (d + "/renamed").c_str())));
  EXPECT_FALSE(Exists(P("new")));
  EXPECT_FALSE(Exists(P("newdir")));
  EXPECT_TRUE(Exists(P("rootfile")));
  EXPECT_TRUE(Exists(P("rootdir")));

  // Control: in a world-writable directory the same calls work, and what the
  // user creates is the user's.
  const std::string rootdir = P("rootdir");
  EXPECT_AS_NOBODY(0, OpenCloseErr(rootdir + "/new", O_CREAT | O_WRONLY, 0640));
  EXPECT_AS_NOBODY(0, Err(mkdir((rootdir + "/newdir").c_str(), 0755)));
  EXPECT_AS_NOBODY(0, Err(symlink("new", (rootdir + "/newlink").c_str())));
  struct stat st = Lstat(P("rootdir/new"));
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_gid, kNogroup);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(Lstat(P("rootdir/newdir")).st_uid, kNobody);
  EXPECT_EQ(Lstat(P("rootdir/newdir")).st_gid, kNogroup);
  EXPECT_EQ(Lstat(P("rootdir/newlink")).st_uid, kNobody);
}

TEST_F(PermissionsTest, DirectorySearchAndReadPermission) {
  ASSERT_EQ(mkdir(P("noaccess").c_str(), 0700), 0);
  WriteFile(P("noaccess/f"), "x", 0644);
  ASSERT_EQ(mkdir(P("searchonly").c_str(), 0711), 0);
  WriteFile(P("searchonly/f"), "x", 0644);
  ASSERT_EQ(mkdir(P("readonly").c_str(), 0744), 0);
  WriteFile(P("readonly/f"), "x", 0644);

  auto stat_err = [](const std::string& path) {
    struct stat st {};
    return Err(stat(path.c_str(), &st));
  };
  auto list_err = [](const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return errno;
    close(fd);
    return 0;
  };
  const std::string d = dir_;
  EXPECT_AS_NOBODY(EACCES, stat_err(d + "/noaccess/f"));
  EXPECT_AS_NOBODY(EACCES, list_err(d + "/noaccess"));
  EXPECT_AS_NOBODY(0, stat_err(d + "/searchonly/f"));
  EXPECT_AS_NOBODY(EACCES, list_err(d + "/searchonly"));
  EXPECT_AS_NOBODY(0, OpenCloseErr(d + "/searchonly/f", O_RDONLY));
  EXPECT_AS_NOBODY(EACCES, stat_err(d + "/readonly/f"));
  EXPECT_AS_NOBODY(0, list_err(d + "/readonly"));
}

TEST_F(PermissionsTest, OnlyTheOwnerMayChmodAndNobodyMayGiveAFileAway) {
  WriteFile(P("rootfile"), "x", 0666);
  ASSERT_EQ(mkdir(P("open").c_str(), 0777), 0);
  const std::string rootfile = P("rootfile");
  const std::string mine = P("open/mine");
  EXPECT_AS_NOBODY(0, OpenCloseErr(mine, O_CREAT | O_WRONLY, 0644));

  EXPECT_AS_NOBODY(EPERM, Err(chmod(rootfile.c_str(), 0777)));
  EXPECT_AS_NOBODY(EPERM, Err(chown(rootfile.c_str(), kNobody, kNogroup)));
  EXPECT_EQ(Lstat(rootfile).st_mode & 07777, 0666u);
  EXPECT_EQ(Lstat(rootfile).st_uid, 0u);

  EXPECT_AS_NOBODY(0, Err(chmod(mine.c_str(), 0600)));
  EXPECT_EQ(Lstat(mine).st_mode & 07777, 0600u);
  EXPECT_AS_NOBODY(EPERM, Err(chown(mine.c_str(), 0, static_cast<gid_t>(-1))));
  // Not a member of group 0.
  EXPECT_AS_NOBODY(EPERM, Err(chown(mine.c_str(), static_cast<uid_t>(-1), 0)));
  // A chown to the owner's own ids is allowed.
  EXPECT_AS_NOBODY(0, Err(chown(mine.c_str(), kNobody, kNogroup)));
  EXPECT_EQ(Lstat(mine).st_uid, kNobody);
  EXPECT_EQ(Lstat(mine).st_gid, kNogroup);
}

TEST_F(PermissionsTest, SettingTimesNeedsOwnershipOrWriteAccess) {
  WriteFile(P("writable"), "x", 0666);
  WriteFile(P("readonly"), "x", 0644);
  const std::string writable = P("writable");
  const std::string readonly = P("readonly");
  timespec explicit_times[2] = {{1000, 0}, {2000, 0}};
  // Explicit times need ownership.
  EXPECT_AS_NOBODY(EPERM, Err(utimensat(AT_FDCWD, writable.c_str(), explicit_times, 0)));
  // "Now" needs only write access.
  EXPECT_AS_NOBODY(0, Err(utimensat(AT_FDCWD, writable.c_str(), nullptr, 0)));
  EXPECT_AS_NOBODY(EACCES, Err(utimensat(AT_FDCWD, readonly.c_str(), nullptr, 0)));
  EXPECT_NE(Lstat(writable).st_mtim.tv_sec, 2000);
}

TEST_F(PermissionsTest, StickyDirectoryProtectsOtherUsersEntries) {
  ASSERT_EQ(mkdir(P("tmp").c_str(), 0777), 0);
  ASSERT_EQ(chmod(P("tmp").c_str(), 01777), 0);
  WriteFile(P("tmp/rootfile"), "root", 0666);
  WriteFile(P("tmp/otherfile"), "other", 0666);
  ASSERT_EQ(chown(P("tmp/otherfile").c_str(), 1000, 1000), 0);
  ASSERT_EQ(mkdir(P("tmp/rootdir").c_str(), 0777), 0);
  const std::string tmp = P("tmp");

  EXPECT_AS_NOBODY(EPERM, Err(unlink((tmp + "/rootfile").c_str())));
  EXPECT_AS_NOBODY(EPERM, Err(unlink((tmp + "/otherfile").c_str())));
  EXPECT_AS_NOBODY(EPERM, Err(rename((tmp + "/rootfile").c_str(), (tmp + "/stolen").c_str())));
  EXPECT_AS_NOBODY(EPERM, Err(rmdir((tmp + "/rootdir").c_str())));
  // Replacing someone else's entry by renaming over it is also refused.
  EXPECT_AS_NOBODY(0, OpenCloseErr(tmp + "/mine", O_CREAT | O_WRONLY, 0644));
  EXPECT_AS_NOBODY(EPERM, Err(rename((tmp + "/mine").c_str(), (tmp + "/rootfile").c_str())));
  EXPECT_EQ(ReadFile(P("tmp/rootfile")), "root");
  EXPECT_EQ(ReadFile(P("tmp/otherfile")), "other");
  EXPECT_TRUE(Exists(P("tmp/rootdir")));

  // The user's own entries can be renamed and removed.
  EXPECT_AS_NOBODY(0, Err(rename((tmp + "/mine").c_str(), (tmp + "/mine2").c_str())));
  EXPECT_AS_NOBODY(0, Err(unlink((tmp + "/mine2").c_str())));
  EXPECT_FALSE(Exists(P("tmp/mine2")));

  // Without the sticky bit the same unlink is allowed.
  ASSERT_EQ(chmod(P("tmp").c_str(), 0777), 0);
  EXPECT_AS_NOBODY(0, Err(unlink((tmp + "/rootfile").c_str())));
  EXPECT_FALSE(Exists(P("tmp/rootfile")));
}

TEST_F(PermissionsTest, StickyDirectoryOwnerMayRemoveAnyEntry) {
  ASSERT_EQ(mkdir(P("tmp").c_str(), 0777), 0);
  ASSERT_EQ(chown(P("tmp").c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(chmod(P("tmp").c_str(), 01777), 0);
  WriteFile(P("tmp/otherfile"), "other", 0644);
  ASSERT_EQ(chown(P("tmp/otherfile").c_str(), 1000, 1000), 0);
  const std::string victim = P("tmp/otherfile");
  EXPECT_AS_NOBODY(0, Err(unlink(victim.c_str())));
  EXPECT_FALSE(Exists(victim));
}

TEST_F(PermissionsTest, WritingAReadOnlyFileIsDenied) {
  ASSERT_EQ(mkdir(P("open").c_str(), 0777), 0);
  const std::string f = P("open/ro");
  // Creating with mode 0444 still hands the creator a writable descriptor.
  EXPECT_AS_NOBODY(0, [&] {
    int fd = open(f.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0444);
    if (fd < 0) return errno;
    int err = write(fd, "created", 7) == 7 ? 0 : errno;
    close(fd);
    return err;
  }());
  EXPECT_EQ(Lstat(f).st_mode & 07777, 0444u);
  EXPECT_EQ(Lstat(f).st_uid, kNobody);
  EXPECT_EQ(ReadFile(f), "created");

  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(f, O_WRONLY));
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(f, O_RDWR));
  EXPECT_AS_NOBODY(EACCES, OpenCloseErr(f, O_WRONLY | O_TRUNC));
  EXPECT_AS_NOBODY(EACCES, Err(truncate(f.c_str(), 0)));
  EXPECT_AS_NOBODY(EACCES, Err(access(f.c_str(), W_OK)));
  EXPECT_AS_NOBODY(0, OpenCloseErr(f, O_RDONLY));
  EXPECT_EQ(ReadFile(f), "created");
  EXPECT_EQ(Lstat(f).st_size, 7);

  // Permission is checked at open: a descriptor opened before the chmod
  // keeps working.
  const std::string g = P("open/later");
  EXPECT_AS_NOBODY(0, [&] {
    int fd = open(g.c_str(), O_CREAT | O_WRONLY, 0644);
    if (fd < 0) return errno;
    int err = fchmod(fd, 0444) == 0 ? 0 : errno;
    if (err == 0 && write(fd, "after", 5) != 5) err = errno;
    close(fd);
    return err;
  }());
  EXPECT_EQ(ReadFile(g), "after");

  // Root may write it anyway.
  EXPECT_EQ(OpenCloseErr(f, O_WRONLY), 0);
}

TEST_F(PermissionsTest, XattrAccessFollowsFilePermissions) {
  WriteFile(P("rootfile"), "x", 0644);
  WriteFile(P("private"), "x", 0600);
  ASSERT_EQ(setxattr(P("rootfile").c_str(), "user.k", "v", 1, 0), 0) << ErrnoName(errno);
  ASSERT_EQ(setxattr(P("private").c_str(), "user.k", "v", 1, 0), 0);
  const std::string rootfile = P("rootfile");
  const std::string priv = P("private");
  EXPECT_AS_NOBODY(EACCES, Err(setxattr(rootfile.c_str(), "user.k", "w", 1, 0)));
  EXPECT_AS_NOBODY(EACCES, Err(removexattr(rootfile.c_str(), "user.k")));
  EXPECT_AS_NOBODY(0, [&] {
    char buf[8];
    ssize_t n = getxattr(rootfile.c_str(), "user.k", buf, sizeof buf);
    return n == 1 && buf[0] == 'v' ? 0 : (n < 0 ? errno : EIO);
  }());
  EXPECT_AS_NOBODY(EACCES, [&] {
    char buf[8];
    return Err(getxattr(priv.c_str(), "user.k", buf, sizeof buf));
  }());
  char buf[8];
  EXPECT_EQ(getxattr(rootfile.c_str(), "user.k", buf, sizeof buf), 1);
  EXPECT_EQ(buf[0], 'v');
}

// A write by uid 65534 (gid 65534, no other groups) through a handle opened
// with `access` to its own file in `dir` of group `group` and mode `mode`
// leaves mode `expected`, as seen by the writer at once (statx asking only
// for the mode: answered from the kernel's cache unless the daemon said it
// changed) and afterwards.
void ExpectWriteLeavesMode(const std::string& dir, int access, gid_t group, mode_t mode, mode_t expected) {
  const std::string f = dir + "/prog" + std::to_string(mode) + "_" + std::to_string(group);
  ASSERT_EQ(OpenCloseErr(f, O_CREAT | O_WRONLY, 0755), 0);
  ASSERT_EQ(chown(f.c_str(), kNobody, group), 0);
  ASSERT_EQ(chmod(f.c_str(), mode), 0);
  ASSERT_EQ(Lstat(f).st_mode & 07777, mode);
  const int seen_by_writer = AsNobody([&] {
    int fd = open(f.c_str(), access);
    if (fd < 0) return -100 - errno;
    bool written = write(fd, "x", 1) == 1;
    close(fd);
    struct statx stx {};
    if (!written || statx(AT_FDCWD, f.c_str(), 0, STATX_MODE, &stx) != 0) return -200 - errno;
    return static_cast<int>(stx.stx_mode & 07777);
  });
  EXPECT_EQ(seen_by_writer, static_cast<int>(expected)) << f << " right after the write";
  EXPECT_EQ(Lstat(f).st_mode & 07777, expected) << f;
}

// What a write by a user without CAP_FSETID drops, as on ext4 (the kernel's
// should_remove_suid): S_ISUID, and S_ISGID of a group-executable file,
// whatever the writer's groups. A write-only handle bypasses the page cache (direct_io), where
// the kernel leaves this to the daemon; a read-write one goes through it.
void ExpectUnprivilegedWritesDropSetIdBits(const std::string& dir, int access) {
  constexpr gid_t kOtherGroup = 4321;
  ExpectWriteLeavesMode(dir, access, kNogroup, 04755, 0755);
  ExpectWriteLeavesMode(dir, access, kOtherGroup, 02755, 0755);
  ExpectWriteLeavesMode(dir, access, kOtherGroup, 02745, 02745);  // not group-executable: kept
  ExpectWriteLeavesMode(dir, access, kNogroup, 02745, 02745);
}

TEST_F(PermissionsTest, UnprivilegedWriteClearsSetuid) {
  ASSERT_EQ(mkdir(P("open").c_str(), 0777), 0);
  ExpectUnprivilegedWritesDropSetIdBits(P("open"), O_WRONLY);
}

TEST_F(PermissionsTest, UnprivilegedWriteThroughTheCacheClearsSetuid) {
  ASSERT_EQ(mkdir(P("rw").c_str(), 0777), 0);
  ExpectUnprivilegedWritesDropSetIdBits(P("rw"), O_RDWR);
}

// File capabilities to set: a version 2 vfs_cap_data (magic and flags, then
// permitted/inheritable pairs) with CAP_NET_BIND_SERVICE permitted.
constexpr uint32_t kSomeFileCapabilities[5] = {0x02000000u, 1u << 10, 0, 0, 0};

// A write-only handle whose writes found nothing to strip looks again after
// a change of mode or of a security attribute (the daemon's privilege epoch).
TEST_F(PermissionsTest, AWriteOnlyHandleStripsWhatIsAddedWhileItIsOpen) {
  ASSERT_EQ(mkdir(P("again").c_str(), 0777), 0);
  const std::string f = P("again/prog");
  ASSERT_EQ(OpenCloseErr(f, O_CREAT | O_WRONLY, 0755), 0);
  ASSERT_EQ(chown(f.c_str(), kNobody, kNogroup), 0);
  const int mode_seen = AsNobody([&] {
    int fd = open(f.c_str(), O_WRONLY);
    if (fd < 0) return -100 - errno;
    bool ok = write(fd, "x", 1) == 1 && fchmod(fd, 04755) == 0 && write(fd, "y", 1) == 1;
    close(fd);
    struct stat st {};
    if (!ok || stat(f.c_str(), &st) != 0) return -200 - errno;
    return static_cast<int>(st.st_mode & 07777);
  });
  EXPECT_EQ(mode_seen, 0755) << "S_ISUID set while the handle was open, then a write";

  const auto& caps = kSomeFileCapabilities;
  ASSERT_EQ(chmod(f.c_str(), 0755), 0);  // nothing to strip: the handle's first write finds it clean
  int fd = open(f.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(write(fd, "x", 1), 1);
  ASSERT_EQ(setxattr(f.c_str(), "security.capability", caps, sizeof caps, 0), 0) << strerror(errno);
  EXPECT_EQ(write(fd, "y", 1), 1);
  close(fd);
  errno = 0;
  EXPECT_EQ(getxattr(f.c_str(), "security.capability", nullptr, 0), -1) << "capabilities set while open";
  EXPECT_EQ(errno, ENODATA);
}

// Every write removes file capabilities, root's too (the kernel's
// file_remove_privs; the daemon's own for write-only handles).
TEST_F(PermissionsTest, WritesRemoveFileCapabilities) {
  const auto& caps = kSomeFileCapabilities;
  for (int access : {O_WRONLY, O_RDWR}) {
    const std::string f = P(access == O_WRONLY ? "capw" : "caprw");
    ASSERT_EQ(OpenCloseErr(f, O_CREAT | O_WRONLY, 0755), 0);
    ASSERT_EQ(setxattr(f.c_str(), "security.capability", caps, sizeof caps, 0), 0) << strerror(errno);
    ASSERT_EQ(getxattr(f.c_str(), "security.capability", nullptr, 0), static_cast<ssize_t>(sizeof caps));
    int fd = open(f.c_str(), access);
    ASSERT_GE(fd, 0) << strerror(errno);
    EXPECT_EQ(write(fd, "x", 1), 1) << strerror(errno);
    close(fd);
    errno = 0;
    EXPECT_EQ(getxattr(f.c_str(), "security.capability", nullptr, 0), -1) << f;
    EXPECT_EQ(errno, ENODATA) << f;
  }
}

TEST_F(PermissionsTest, SetgidDirectoryForANonMember) {
  ASSERT_EQ(mkdir(P("shared").c_str(), 0777), 0);
  ASSERT_EQ(chown(P("shared").c_str(), 0, 4321), 0);
  ASSERT_EQ(chmod(P("shared").c_str(), 02777), 0);
  const std::string shared = P("shared");
  EXPECT_AS_NOBODY(0, OpenCloseErr(shared + "/f", O_CREAT | O_WRONLY, 02755));
  EXPECT_AS_NOBODY(0, Err(mkdir((shared + "/d").c_str(), 0755)));
  struct stat f = Lstat(P("shared/f"));
  EXPECT_EQ(f.st_uid, kNobody);
  EXPECT_EQ(f.st_gid, 4321u);
  EXPECT_EQ(f.st_mode & 07777, 0755u) << "S_ISGID is dropped for a creator outside the file's group";
  struct stat d = Lstat(P("shared/d"));
  EXPECT_EQ(d.st_gid, 4321u);
  EXPECT_EQ(d.st_mode & 07777, 02755u) << "subdirectories inherit S_ISGID regardless";
}

TEST(PermissionsMountTest, WithoutAllowOtherOtherUsersAreShutOut) {
  umask(0);
  std::unique_ptr<MountedVolume> volume;
  try {
    volume = std::make_unique<MountedVolume>();
  } catch (const std::exception& e) {
    FAIL() << "could not mount a volume: " << e.what();
  }
  MakeParentTraversable(volume->mountpoint());
  ASSERT_EQ(chmod(volume->mountpoint().c_str(), 0755), 0) << ErrnoName(errno);
  const std::string mnt = volume->mountpoint();
  // FUSE answers EACCES to any user other than the one that mounted it,
  // whatever the modes say.
  EXPECT_AS_NOBODY(EACCES, [&] {
    struct stat st {};
    return Err(stat(mnt.c_str(), &st));
  }());
  struct stat st {};
  EXPECT_EQ(stat(mnt.c_str(), &st), 0) << "root still gets in";
}

}  // namespace
}  // namespace spillfs::testing
