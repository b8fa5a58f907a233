// Namespace operations on a mounted spillfs volume, driven through system
// calls: create, mknod, mkdir, rmdir, unlink, rename (with RENAME_NOREPLACE and
// RENAME_EXCHANGE), link, symlink/readlink, readdir, link counts, name length
// limits, open-unlinked files and statfs accounting. Every expected value and
// errno is what ext4 gives for the same sequence of calls.
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/errno_names.h"
#include "support/eventually.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"
#include "support/shared_volume.h"

namespace spillfs::testing {
namespace {

// open()+close(); returns 0 or -1 with errno set (never leaks a descriptor,
// which would keep the volume busy at unmount).
int OpenClose(const std::string& path, int flags, mode_t mode = 0644) {
  int fd = open(path.c_str(), flags, mode);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[1 << 16];
  off_t off = 0;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n < 0) {
      ADD_FAILURE() << "pread failed: " << ErrnoName(errno);
      return out;
    }
    if (n == 0) return out;
    out.append(buf, n);
    off += n;
  }
}

struct DirEntry {
  ino_t ino;
  unsigned char type;
};

// Every entry of a directory (including "." and ".."), by name. A name seen
// twice is a failure.
std::map<std::string, DirEntry> ListDirWithDots(const std::string& path) {
  std::map<std::string, DirEntry> out;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    ADD_FAILURE() << "opendir " << path << ": " << ErrnoName(errno);
    return out;
  }
  errno = 0;
  while (struct dirent* e = readdir(dir)) {
    bool inserted = out.emplace(e->d_name, DirEntry{e->d_ino, e->d_type}).second;
    EXPECT_TRUE(inserted) << "readdir of " << path << " returned " << e->d_name << " twice";
    errno = 0;
  }
  EXPECT_EQ(errno, 0) << "readdir " << path << ": " << ErrnoName(errno);
  closedir(dir);
  return out;
}

std::set<std::string> ListDir(const std::string& path) {
  std::set<std::string> names;
  for (const auto& [name, entry] : ListDirWithDots(path)) {
    if (name != "." && name != "..") names.insert(name);
  }
  return names;
}

constexpr uint64_t kMiB = 1 << 20;

class NamespaceTest : public SharedVolumeTest {};

// ---------------------------------------------------------------- create/open

TEST_F(NamespaceTest, RootIsA0755DirectoryOwnedByRoot) {
  // mkfs.ext4 makes the root directory drwxr-xr-x root:root.
  struct stat st = Stat(volume_->mountpoint());
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, 0u);
}

TEST_F(NamespaceTest, CreateExclusiveMakesEmptyRegularFile) {
  Fd fd(open(P("f").c_str(), O_CREAT | O_EXCL | O_RDWR, 0640));
  ASSERT_TRUE(fd.valid()) << ErrnoName(errno);
  struct stat fst {};
  ASSERT_EQ(fstat(fd.get(), &fst), 0);
  EXPECT_TRUE(S_ISREG(fst.st_mode));
  EXPECT_EQ(fst.st_mode & 07777, 0640u);
  EXPECT_EQ(fst.st_size, 0);
  EXPECT_EQ(fst.st_nlink, 1u);
  EXPECT_EQ(fst.st_uid, 0u);
  EXPECT_EQ(fst.st_gid, 0u);
  EXPECT_EQ(fst.st_blocks, 0);
  struct stat st = Stat(P("f"));
  EXPECT_EQ(st.st_ino, fst.st_ino);
  EXPECT_NE(st.st_ino, Stat(dir_).st_ino);

  EXPECT_ERRNO(EEXIST, OpenClose(P("f"), O_CREAT | O_EXCL | O_WRONLY, 0600));
}

TEST_F(NamespaceTest, CreateWithoutExclOpensExistingFileUnchanged) {
  WriteFile(P("f"), "contents", 0640);
  ino_t ino = Stat(P("f")).st_ino;
  EXPECT_ERRNO(0, OpenClose(P("f"), O_CREAT | O_WRONLY, 0600));
  struct stat st = Stat(P("f"));
  EXPECT_EQ(st.st_ino, ino);
  EXPECT_EQ(st.st_mode & 07777, 0640u) << "O_CREAT on an existing file must not change its mode";
  EXPECT_EQ(ReadFile(P("f")), "contents");
  // O_TRUNC empties it.
  EXPECT_ERRNO(0, OpenClose(P("f"), O_CREAT | O_WRONLY | O_TRUNC, 0600));
  EXPECT_EQ(Stat(P("f")).st_size, 0);
  EXPECT_EQ(ReadFile(P("f")), "");
}

TEST_F(NamespaceTest, UmaskIsApplied) {
  mode_t old = umask(027);
  EXPECT_ERRNO(0, OpenClose(P("f"), O_CREAT | O_WRONLY, 0666));
  EXPECT_ERRNO(0, mkdir(P("d").c_str(), 0777));
  EXPECT_ERRNO(0, mknod(P("fifo").c_str(), S_IFIFO | 0666, 0));
  umask(old);
  EXPECT_EQ(Stat(P("f")).st_mode & 07777, 0640u);
  EXPECT_EQ(Stat(P("d")).st_mode & 07777, 0750u);
  EXPECT_EQ(Lstat(P("fifo")).st_mode & 07777, 0640u);
}

TEST_F(NamespaceTest, OpenErrors) {
  WriteFile(P("file"), "x");
  ASSERT_EQ(mkdir(P("dir").c_str(), 0755), 0);
  ASSERT_EQ(symlink("nowhere", P("dangling").c_str()), 0);

  EXPECT_ERRNO(ENOENT, OpenClose(P("missing"), O_RDONLY));
  EXPECT_ERRNO(ENOENT, OpenClose(P("missing/f"), O_CREAT | O_WRONLY));
  EXPECT_ERRNO(ENOTDIR, OpenClose(P("file/f"), O_RDONLY));
  EXPECT_ERRNO(ENOTDIR, OpenClose(P("file/f"), O_CREAT | O_WRONLY));
  EXPECT_ERRNO(ENOTDIR, OpenClose(P("file"), O_RDONLY | O_DIRECTORY));
  EXPECT_ERRNO(EISDIR, OpenClose(P("dir"), O_WRONLY));
  EXPECT_ERRNO(EISDIR, OpenClose(P("dir"), O_RDWR));
  EXPECT_ERRNO(EISDIR, OpenClose(P("dir"), O_CREAT | O_WRONLY));
  EXPECT_ERRNO(EEXIST, OpenClose(P("dir"), O_CREAT | O_EXCL | O_WRONLY));
  // O_EXCL does not follow a symlink, even a dangling one.
  EXPECT_ERRNO(EEXIST, OpenClose(P("dangling"), O_CREAT | O_EXCL | O_WRONLY));
  EXPECT_ERRNO(0, OpenClose(P("dir"), O_RDONLY | O_DIRECTORY));
  // O_CREAT through a dangling symlink creates its target.
  EXPECT_ERRNO(0, OpenClose(P("dangling"), O_CREAT | O_WRONLY, 0600));
  EXPECT_TRUE(S_ISREG(Stat(P("nowhere")).st_mode));
}

// ---------------------------------------------------------------------- mknod

TEST_F(NamespaceTest, MknodMakesEveryFileType) {
  EXPECT_ERRNO(0, mknod(P("fifo").c_str(), S_IFIFO | 0640, 0));
  EXPECT_ERRNO(0, mknod(P("reg").c_str(), S_IFREG | 0600, 0));
  EXPECT_ERRNO(0, mknod(P("chr").c_str(), S_IFCHR | 0620, makedev(1, 3)));
  EXPECT_ERRNO(0, mknod(P("blk").c_str(), S_IFBLK | 0660, makedev(8, 17)));
  EXPECT_ERRNO(0, mknod(P("sock").c_str(), S_IFSOCK | 0755, 0));
  EXPECT_ERRNO(0, mkfifo(P("fifo2").c_str(), 0600));

  struct stat st = Lstat(P("fifo"));
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(st.st_size, 0);
  st = Lstat(P("reg"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  st = Lstat(P("chr"));
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0620u);
  EXPECT_EQ(st.st_rdev, makedev(1, 3));
  st = Lstat(P("blk"));
  EXPECT_TRUE(S_ISBLK(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(8, 17));
  st = Lstat(P("sock"));
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_TRUE(S_ISFIFO(Lstat(P("fifo2")).st_mode));

  EXPECT_ERRNO(EEXIST, mknod(P("fifo").c_str(), S_IFIFO | 0600, 0));
  EXPECT_ERRNO(EEXIST, mknod(P("reg").c_str(), S_IFREG | 0600, 0));
  EXPECT_ERRNO(ENOENT, mknod(P("missing/x").c_str(), S_IFIFO | 0600, 0));
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"blk", "chr", "fifo", "fifo2", "reg", "sock"}));
}

// ---------------------------------------------------------------- mkdir/rmdir

TEST_F(NamespaceTest, MkdirMakesEmptyDirectoryAndCountsLinks) {
  EXPECT_EQ(Stat(dir_).st_nlink, 2u);
  ASSERT_EQ(mkdir(P("d").c_str(), 0750), 0) << ErrnoName(errno);
  struct stat st = Stat(P("d"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_nlink, 2u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(Stat(dir_).st_nlink, 3u) << "a new subdirectory adds one link to its parent";
  EXPECT_EQ(ListDir(P("d")), std::set<std::string>{});

  auto entries = ListDirWithDots(P("d"));
  ASSERT_EQ(entries.size(), 2u);
  ASSERT_TRUE(entries.count("."));
  ASSERT_TRUE(entries.count(".."));
  EXPECT_EQ(entries["."].ino, st.st_ino);
  EXPECT_EQ(entries[".."].ino, Stat(dir_).st_ino);
  EXPECT_EQ(Stat(P("d/..")).st_ino, Stat(dir_).st_ino);

  ASSERT_EQ(mkdir(P("d2").c_str(), 01777), 0);
  EXPECT_EQ(Stat(P("d2")).st_mode & 07777, 01777u) << "mkdir keeps the sticky bit";
  EXPECT_EQ(Stat(dir_).st_nlink, 4u);
  WriteFile(P("file"), "");
  EXPECT_EQ(Stat(dir_).st_nlink, 4u) << "files do not add links to their directory";
}

TEST_F(NamespaceTest, MkdirErrors) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  WriteFile(P("file"), "x");
  EXPECT_ERRNO(EEXIST, mkdir(P("d").c_str(), 0755));
  EXPECT_ERRNO(EEXIST, mkdir(P("file").c_str(), 0755));
  EXPECT_ERRNO(ENOENT, mkdir(P("missing/d").c_str(), 0755));
  EXPECT_ERRNO(ENOTDIR, mkdir(P("file/d").c_str(), 0755));
  EXPECT_EQ(Stat(dir_).st_nlink, 3u) << "failed mkdirs must not change the link count";
}

TEST_F(NamespaceTest, RmdirRemovesEmptyDirectory) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(Stat(dir_).st_nlink, 3u);
  EXPECT_ERRNO(0, rmdir(P("d").c_str()));
  struct stat st {};
  EXPECT_ERRNO(ENOENT, stat(P("d").c_str(), &st));
  EXPECT_EQ(Stat(dir_).st_nlink, 2u);
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{});
  // The name can be used again.
  EXPECT_ERRNO(0, mkdir(P("d").c_str(), 0700));
  EXPECT_EQ(Stat(P("d")).st_mode & 07777, 0700u);
}

TEST_F(NamespaceTest, RmdirErrors) {
  ASSERT_EQ(mkdir(P("full").c_str(), 0755), 0);
  WriteFile(P("full/f"), "x");
  ASSERT_EQ(mkdir(P("hassub").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("hassub/sub").c_str(), 0755), 0);
  WriteFile(P("file"), "x");
  ASSERT_EQ(symlink("full", P("link").c_str()), 0);

  EXPECT_ERRNO(ENOTEMPTY, rmdir(P("full").c_str()));
  EXPECT_ERRNO(ENOTEMPTY, rmdir(P("hassub").c_str()));
  EXPECT_ERRNO(ENOTDIR, rmdir(P("file").c_str()));
  EXPECT_ERRNO(ENOTDIR, rmdir(P("link").c_str()));
  EXPECT_ERRNO(ENOENT, rmdir(P("missing").c_str()));
  EXPECT_ERRNO(ENOTDIR, rmdir(P("file/x").c_str()));
  EXPECT_EQ(ListDir(P("full")), std::set<std::string>{"f"});
  EXPECT_EQ(ListDir(P("hassub")), std::set<std::string>{"sub"});
  EXPECT_EQ(Stat(dir_).st_nlink, 4u);
}

TEST_F(NamespaceTest, RmdirSucceedsWhenOnlyAnOpenUnlinkedFileRemains) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  Fd fd(open(P("d/f").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), "still here"));
  ASSERT_EQ(unlink(P("d/f").c_str()), 0);
  EXPECT_ERRNO(0, rmdir(P("d").c_str()));
  char buf[32] = {};
  EXPECT_EQ(pread(fd.get(), buf, sizeof buf, 0), 10);
  EXPECT_STREQ(buf, "still here");
}

// --------------------------------------------------------------------- unlink

TEST_F(NamespaceTest, UnlinkRemovesNameOnly) {
  WriteFile(P("f"), "data");
  ASSERT_EQ(symlink("f", P("l").c_str()), 0);
  EXPECT_ERRNO(0, unlink(P("l").c_str()));
  EXPECT_EQ(ReadFile(P("f")), "data") << "unlinking a symlink must not touch its target";
  EXPECT_ERRNO(0, unlink(P("f").c_str()));
  struct stat st {};
  EXPECT_ERRNO(ENOENT, lstat(P("f").c_str(), &st));
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{});
}

TEST_F(NamespaceTest, UnlinkErrors) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  WriteFile(P("file"), "x");
  EXPECT_ERRNO(EISDIR, unlink(P("d").c_str()));
  EXPECT_ERRNO(ENOENT, unlink(P("missing").c_str()));
  EXPECT_ERRNO(ENOENT, unlink(P("missing/x").c_str()));
  EXPECT_ERRNO(ENOTDIR, unlink(P("file/x").c_str()));
  EXPECT_TRUE(S_ISDIR(Stat(P("d")).st_mode));
}

// --------------------------------------------------------------------- rename

TEST_F(NamespaceTest, RenameFileWithinAndAcrossDirectories) {
  std::string data = RandomBytes(10000, 1);
  WriteFile(P("a"), data);
  ino_t ino = Stat(P("a")).st_ino;
  ASSERT_EQ(mkdir(P("sub").c_str(), 0755), 0);

  EXPECT_ERRNO(0, rename(P("a").c_str(), P("b").c_str()));
  struct stat st {};
  EXPECT_ERRNO(ENOENT, stat(P("a").c_str(), &st));
  EXPECT_EQ(Stat(P("b")).st_ino, ino);
  EXPECT_EQ(ReadFile(P("b")), data);

  EXPECT_ERRNO(0, rename(P("b").c_str(), P("sub/c").c_str()));
  EXPECT_EQ(Stat(P("sub/c")).st_ino, ino);
  EXPECT_EQ(Stat(P("sub/c")).st_nlink, 1u);
  EXPECT_EQ(ReadFile(P("sub/c")), data);
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{"sub"});
  EXPECT_EQ(ListDir(P("sub")), std::set<std::string>{"c"});
  EXPECT_EQ(Stat(dir_).st_nlink, 3u);
  EXPECT_EQ(Stat(P("sub")).st_nlink, 2u);
}

TEST_F(NamespaceTest, RenameOverExistingFileReplacesIt) {
  WriteFile(P("src"), "new contents");
  WriteFile(P("dst"), "old contents");
  ino_t src_ino = Stat(P("src")).st_ino;
  Fd old_fd(open(P("dst").c_str(), O_RDONLY));
  ASSERT_TRUE(old_fd.valid());

  EXPECT_ERRNO(0, rename(P("src").c_str(), P("dst").c_str()));
  EXPECT_EQ(Stat(P("dst")).st_ino, src_ino);
  EXPECT_EQ(ReadFile(P("dst")), "new contents");
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{"dst"});
  // The replaced file lives on, unlinked, while it is open.
  struct stat fst {};
  ASSERT_EQ(fstat(old_fd.get(), &fst), 0);
  EXPECT_EQ(fst.st_nlink, 0u);
  EXPECT_EQ(ReadAll(old_fd.get()), "old contents");
}

TEST_F(NamespaceTest, RenameDirectoryMovesSubtreeAndFixesLinks) {
  ASSERT_EQ(mkdir(P("a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("a/sub").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("a/sub/inner").c_str(), 0755), 0);
  WriteFile(P("a/sub/file"), "payload");
  ino_t sub_ino = Stat(P("a/sub")).st_ino;
  ASSERT_EQ(Stat(P("a")).st_nlink, 3u);
  ASSERT_EQ(Stat(P("b")).st_nlink, 2u);

  EXPECT_ERRNO(0, rename(P("a/sub").c_str(), P("b/moved").c_str()));
  EXPECT_EQ(Stat(P("a")).st_nlink, 2u);
  EXPECT_EQ(Stat(P("b")).st_nlink, 3u);
  EXPECT_EQ(Stat(P("b/moved")).st_ino, sub_ino);
  EXPECT_EQ(Stat(P("b/moved")).st_nlink, 3u);
  EXPECT_EQ(Stat(P("b/moved/..")).st_ino, Stat(P("b")).st_ino) << "'..' must follow the move";
  auto entries = ListDirWithDots(P("b/moved"));
  EXPECT_EQ(entries[".."].ino, Stat(P("b")).st_ino) << "readdir '..' must follow the move";
  EXPECT_EQ(ReadFile(P("b/moved/file")), "payload");
  EXPECT_EQ(ListDir(P("b/moved")), (std::set<std::string>{"file", "inner"}));
  EXPECT_EQ(ListDir(P("a")), std::set<std::string>{});
  EXPECT_EQ(Stat(dir_).st_nlink, 4u);

  // Moving it up to the test directory itself.
  EXPECT_ERRNO(0, rename(P("b/moved").c_str(), P("top").c_str()));
  EXPECT_EQ(Stat(P("b")).st_nlink, 2u);
  EXPECT_EQ(Stat(dir_).st_nlink, 5u);
  EXPECT_EQ(Stat(P("top/inner/../..")).st_ino, Stat(dir_).st_ino);
}

TEST_F(NamespaceTest, RenameDirectoryOverEmptyDirectory) {
  ASSERT_EQ(mkdir(P("src").c_str(), 0755), 0);
  WriteFile(P("src/f"), "x");
  ASSERT_EQ(mkdir(P("dst").c_str(), 0700), 0);
  ino_t src_ino = Stat(P("src")).st_ino;
  ASSERT_EQ(Stat(dir_).st_nlink, 4u);
  EXPECT_ERRNO(0, rename(P("src").c_str(), P("dst").c_str()));
  EXPECT_EQ(Stat(P("dst")).st_ino, src_ino);
  EXPECT_EQ(Stat(P("dst")).st_mode & 07777, 0755u);
  EXPECT_EQ(ListDir(P("dst")), std::set<std::string>{"f"});
  EXPECT_EQ(Stat(dir_).st_nlink, 3u) << "the replaced directory's link to its parent is gone";
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{"dst"});
}

TEST_F(NamespaceTest, RenameErrors) {
  WriteFile(P("file"), "file");
  WriteFile(P("file2"), "file2");
  ASSERT_EQ(mkdir(P("dir").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("full").c_str(), 0755), 0);
  WriteFile(P("full/x"), "x");
  ASSERT_EQ(mkdir(P("dir/child").c_str(), 0755), 0);

  EXPECT_ERRNO(EISDIR, rename(P("file").c_str(), P("dir").c_str()));
  EXPECT_ERRNO(ENOTDIR, rename(P("dir").c_str(), P("file").c_str()));
  EXPECT_ERRNO(ENOTEMPTY, rename(P("dir").c_str(), P("full").c_str()));
  EXPECT_ERRNO(EINVAL, rename(P("dir").c_str(), P("dir/child/sub").c_str()));
  EXPECT_ERRNO(ENOENT, rename(P("missing").c_str(), P("new").c_str()));
  EXPECT_ERRNO(ENOENT, rename(P("file").c_str(), P("missing/new").c_str()));
  EXPECT_ERRNO(ENOTDIR, rename(P("file").c_str(), P("file2/new").c_str()));
  EXPECT_ERRNO(ENOTDIR, rename(P("file/x").c_str(), P("new").c_str()));

  // Nothing moved.
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"dir", "file", "file2", "full"}));
  EXPECT_EQ(ReadFile(P("file")), "file");
  EXPECT_EQ(ListDir(P("full")), std::set<std::string>{"x"});
  EXPECT_EQ(ListDir(P("dir")), std::set<std::string>{"child"});
}

TEST_F(NamespaceTest, RenameOntoAnotherLinkOfTheSameFileIsANoOp) {
  WriteFile(P("a"), "shared");
  ASSERT_EQ(link(P("a").c_str(), P("b").c_str()), 0);
  // POSIX: if old and new are links to the same file, rename does nothing.
  EXPECT_ERRNO(0, rename(P("a").c_str(), P("b").c_str()));
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(Stat(P("a")).st_nlink, 2u);
  EXPECT_ERRNO(0, rename(P("a").c_str(), P("a").c_str()));
  EXPECT_EQ(ReadFile(P("a")), "shared");
}

TEST_F(NamespaceTest, RenameOverOneOfTwoHardLinksKeepsTheOther) {
  WriteFile(P("a"), "linked");
  ASSERT_EQ(link(P("a").c_str(), P("b").c_str()), 0);
  WriteFile(P("c"), "replacement");
  ino_t linked = Stat(P("a")).st_ino;
  EXPECT_ERRNO(0, rename(P("c").c_str(), P("a").c_str()));
  EXPECT_EQ(ReadFile(P("a")), "replacement");
  struct stat b = Stat(P("b"));
  EXPECT_EQ(b.st_ino, linked);
  EXPECT_EQ(b.st_nlink, 1u) << "the replaced name's inode loses one link, not all";
  EXPECT_EQ(ReadFile(P("b")), "linked");
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"a", "b"}));
}

TEST_F(NamespaceTest, RenameSymlinkAndRenameOverSymlink) {
  WriteFile(P("target"), "t");
  WriteFile(P("other"), "o");
  ASSERT_EQ(symlink("target", P("link").c_str()), 0);
  EXPECT_ERRNO(0, rename(P("link").c_str(), P("link2").c_str()));
  char buf[64] = {};
  EXPECT_EQ(readlink(P("link2").c_str(), buf, sizeof buf), 6);
  EXPECT_STREQ(buf, "target");
  // Renaming a file over a symlink replaces the symlink, not its target.
  EXPECT_ERRNO(0, rename(P("other").c_str(), P("link2").c_str()));
  EXPECT_TRUE(S_ISREG(Lstat(P("link2")).st_mode));
  EXPECT_EQ(ReadFile(P("link2")), "o");
  EXPECT_EQ(ReadFile(P("target")), "t");
}

TEST_F(NamespaceTest, RenameNoReplace) {
  WriteFile(P("a"), "a");
  WriteFile(P("b"), "b");
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(EEXIST, renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("b").c_str(), RENAME_NOREPLACE));
  EXPECT_ERRNO(EEXIST, renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("d").c_str(), RENAME_NOREPLACE));
  EXPECT_EQ(ReadFile(P("a")), "a");
  EXPECT_EQ(ReadFile(P("b")), "b");
  EXPECT_TRUE(S_ISDIR(Stat(P("d")).st_mode));

  ino_t ino = Stat(P("a")).st_ino;
  EXPECT_ERRNO(0, renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("d/c").c_str(), RENAME_NOREPLACE));
  EXPECT_EQ(Stat(P("d/c")).st_ino, ino);
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"b", "d"}));
  EXPECT_ERRNO(ENOENT, renameat2(AT_FDCWD, P("missing").c_str(), AT_FDCWD, P("z").c_str(), RENAME_NOREPLACE));
}

TEST_F(NamespaceTest, RenameExchangeSwapsTwoFiles) {
  WriteFile(P("a"), "contents of a");
  WriteFile(P("b"), "contents of b");
  ino_t a = Stat(P("a")).st_ino;
  ino_t b = Stat(P("b")).st_ino;
  EXPECT_ERRNO(0, renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("b").c_str(), RENAME_EXCHANGE));
  EXPECT_EQ(Stat(P("a")).st_ino, b);
  EXPECT_EQ(Stat(P("b")).st_ino, a);
  EXPECT_EQ(ReadFile(P("a")), "contents of b");
  EXPECT_EQ(ReadFile(P("b")), "contents of a");
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"a", "b"}));
}

TEST_F(NamespaceTest, RenameExchangeFileWithDirectoryAcrossParents) {
  ASSERT_EQ(mkdir(P("p1").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("p2").c_str(), 0755), 0);
  WriteFile(P("p1/x"), "file");
  ASSERT_EQ(mkdir(P("p2/y").c_str(), 0700), 0);
  WriteFile(P("p2/y/child"), "child");
  ino_t file_ino = Stat(P("p1/x")).st_ino;
  ino_t dir_ino = Stat(P("p2/y")).st_ino;
  ASSERT_EQ(Stat(P("p1")).st_nlink, 2u);
  ASSERT_EQ(Stat(P("p2")).st_nlink, 3u);

  EXPECT_ERRNO(0, renameat2(AT_FDCWD, P("p1/x").c_str(), AT_FDCWD, P("p2/y").c_str(), RENAME_EXCHANGE));
  struct stat x = Stat(P("p1/x"));
  EXPECT_TRUE(S_ISDIR(x.st_mode));
  EXPECT_EQ(x.st_ino, dir_ino);
  EXPECT_TRUE(S_ISREG(Stat(P("p2/y")).st_mode));
  EXPECT_EQ(Stat(P("p2/y")).st_ino, file_ino);
  EXPECT_EQ(ReadFile(P("p1/x/child")), "child");
  EXPECT_EQ(ReadFile(P("p2/y")), "file");
  EXPECT_EQ(Stat(P("p1")).st_nlink, 3u) << "p1 gained a subdirectory";
  EXPECT_EQ(Stat(P("p2")).st_nlink, 2u) << "p2 lost a subdirectory";
  EXPECT_EQ(Stat(P("p1/x/..")).st_ino, Stat(P("p1")).st_ino);
}

TEST_F(NamespaceTest, RenameExchangeErrors) {
  WriteFile(P("a"), "a");
  WriteFile(P("b"), "b");
  EXPECT_ERRNO(ENOENT, renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("missing").c_str(), RENAME_EXCHANGE));
  EXPECT_ERRNO(ENOENT, renameat2(AT_FDCWD, P("missing").c_str(), AT_FDCWD, P("a").c_str(), RENAME_EXCHANGE));
  EXPECT_ERRNO(EINVAL,
               renameat2(AT_FDCWD, P("a").c_str(), AT_FDCWD, P("b").c_str(), RENAME_EXCHANGE | RENAME_NOREPLACE));
  EXPECT_EQ(ReadFile(P("a")), "a");
  EXPECT_EQ(ReadFile(P("b")), "b");
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"a", "b"}));
}

// ----------------------------------------------------------------------- link

TEST_F(NamespaceTest, HardLinksShareOneInode) {
  WriteFile(P("a"), "first");
  ASSERT_EQ(mkdir(P("sub").c_str(), 0755), 0);
  EXPECT_ERRNO(0, link(P("a").c_str(), P("b").c_str()));
  EXPECT_ERRNO(0, link(P("a").c_str(), P("sub/c").c_str()));
  struct stat a = Stat(P("a"));
  EXPECT_EQ(a.st_nlink, 3u);
  EXPECT_EQ(Stat(P("b")).st_ino, a.st_ino);
  EXPECT_EQ(Stat(P("sub/c")).st_ino, a.st_ino);
  EXPECT_EQ(Stat(P("sub/c")).st_nlink, 3u);

  // Writes through one name are seen through the others.
  {
    Fd fd(open(P("sub/c").c_str(), O_WRONLY | O_APPEND));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(write(fd.get(), " second", 7), 7);
  }
  EXPECT_EQ(ReadFile(P("a")), "first second");
  EXPECT_EQ(ReadFile(P("b")), "first second");

  EXPECT_ERRNO(0, unlink(P("a").c_str()));
  EXPECT_EQ(Stat(P("b")).st_nlink, 2u);
  EXPECT_ERRNO(0, unlink(P("sub/c").c_str()));
  EXPECT_EQ(Stat(P("b")).st_nlink, 1u);
  EXPECT_EQ(ReadFile(P("b")), "first second");
  EXPECT_EQ(Stat(dir_).st_nlink, 3u) << "hard links to files do not change directory links";
}

TEST_F(NamespaceTest, LinkErrors) {
  WriteFile(P("a"), "a");
  WriteFile(P("b"), "b");
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(EEXIST, link(P("a").c_str(), P("b").c_str()));
  EXPECT_ERRNO(EEXIST, link(P("a").c_str(), P("d").c_str()));
  EXPECT_ERRNO(EPERM, link(P("d").c_str(), P("dlink").c_str()));
  EXPECT_ERRNO(ENOENT, link(P("missing").c_str(), P("c").c_str()));
  EXPECT_ERRNO(ENOENT, link(P("a").c_str(), P("missing/c").c_str()));
  EXPECT_ERRNO(ENOTDIR, link(P("a").c_str(), P("b/c").c_str()));
  EXPECT_EQ(Stat(P("a")).st_nlink, 1u);
  EXPECT_EQ(ReadFile(P("b")), "b");
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"a", "b", "d"}));
}

TEST_F(NamespaceTest, LinkToSymlinkLinksTheSymlinkItself) {
  ASSERT_EQ(symlink("somewhere", P("sl").c_str()), 0);
  // linkat without AT_SYMLINK_FOLLOW links the symlink, like link(2) on Linux.
  EXPECT_ERRNO(0, linkat(AT_FDCWD, P("sl").c_str(), AT_FDCWD, P("sl2").c_str(), 0));
  struct stat st = Lstat(P("sl2"));
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(st.st_ino, Lstat(P("sl")).st_ino);
  EXPECT_EQ(st.st_nlink, 2u);
  char buf[64] = {};
  EXPECT_EQ(readlink(P("sl2").c_str(), buf, sizeof buf), 9);
  EXPECT_STREQ(buf, "somewhere");
}

// -------------------------------------------------------------------- symlink

TEST_F(NamespaceTest, SymlinkAndReadlink) {
  WriteFile(P("target"), "through the link");
  EXPECT_ERRNO(0, symlink("target", P("rel").c_str()));
  EXPECT_ERRNO(0, symlink(P("target").c_str(), P("abs").c_str()));
  EXPECT_ERRNO(0, symlink("does/not/exist", P("dangling").c_str()));

  struct stat st = Lstat(P("rel"));
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  EXPECT_EQ(st.st_size, 6) << "a symlink's size is the length of its target";
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_EQ(Lstat(P("abs")).st_size, static_cast<off_t>(P("target").size()));

  char buf[4096];
  ssize_t n = readlink(P("rel").c_str(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "target");
  n = readlink(P("abs").c_str(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), P("target"));
  n = readlink(P("dangling").c_str(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "does/not/exist");

  // Following.
  EXPECT_EQ(Stat(P("rel")).st_ino, Stat(P("target")).st_ino);
  EXPECT_EQ(ReadFile(P("rel")), "through the link");
  EXPECT_EQ(ReadFile(P("abs")), "through the link");
  struct stat tmp {};
  EXPECT_ERRNO(ENOENT, stat(P("dangling").c_str(), &tmp));
  EXPECT_ERRNO(0, lstat(P("dangling").c_str(), &tmp));

  // A short buffer gets a truncated, unterminated target.
  memset(buf, 'Z', sizeof buf);
  EXPECT_EQ(readlink(P("dangling").c_str(), buf, 4), 4);
  EXPECT_EQ(std::string(buf, 5), "does" + std::string("Z"));
}

TEST_F(NamespaceTest, SymlinkErrors) {
  WriteFile(P("file"), "x");
  ASSERT_EQ(symlink("file", P("l").c_str()), 0);
  char buf[64];
  EXPECT_ERRNO(EEXIST, symlink("other", P("file").c_str()));
  EXPECT_ERRNO(EEXIST, symlink("other", P("l").c_str()));
  EXPECT_ERRNO(ENOENT, symlink("other", P("missing/l").c_str()));
  EXPECT_ERRNO(EINVAL, readlink(P("file").c_str(), buf, sizeof buf));
  EXPECT_ERRNO(EINVAL, readlink(dir_.c_str(), buf, sizeof buf));
  EXPECT_ERRNO(ENOENT, readlink(P("missing").c_str(), buf, sizeof buf));
  ssize_t n = readlink(P("l").c_str(), buf, sizeof buf);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "file") << "a failed symlink must not overwrite";
}

TEST_F(NamespaceTest, LongestSymlinkTarget) {
  // PATH_MAX - 1 bytes: the longest target Linux accepts (ext4 with 4 KiB
  // blocks stores it).
  std::string target;
  for (int i = 0; target.size() < 4095; ++i) target += "component" + std::to_string(i) + "/";
  target.resize(4095);
  EXPECT_ERRNO(0, symlink(target.c_str(), P("long").c_str()));
  EXPECT_EQ(Lstat(P("long")).st_size, 4095);
  std::string buf(8192, '\0');
  ssize_t n = readlink(P("long").c_str(), buf.data(), buf.size());
  ASSERT_EQ(n, 4095) << ErrnoName(errno);
  EXPECT_EQ(buf.substr(0, n), target);
}

// -------------------------------------------------------------------- readdir

TEST_F(NamespaceTest, ReaddirReportsTypesAndInodes) {
  WriteFile(P("reg"), "x");
  ASSERT_EQ(mkdir(P("dir").c_str(), 0755), 0);
  ASSERT_EQ(symlink("reg", P("lnk").c_str()), 0);
  ASSERT_EQ(mknod(P("fifo").c_str(), S_IFIFO | 0644, 0), 0);
  ASSERT_EQ(mknod(P("sock").c_str(), S_IFSOCK | 0644, 0), 0);
  ASSERT_EQ(mknod(P("chr").c_str(), S_IFCHR | 0644, makedev(1, 5)), 0);
  ASSERT_EQ(mknod(P("blk").c_str(), S_IFBLK | 0644, makedev(7, 0)), 0);
  ASSERT_EQ(link(P("reg").c_str(), P("hard").c_str()), 0);

  auto entries = ListDirWithDots(dir_);
  std::map<std::string, unsigned char> expected_types = {
      {".", DT_DIR},     {"..", DT_DIR},    {"reg", DT_REG}, {"dir", DT_DIR}, {"lnk", DT_LNK},
      {"fifo", DT_FIFO}, {"sock", DT_SOCK}, {"chr", DT_CHR}, {"blk", DT_BLK}, {"hard", DT_REG}};
  ASSERT_EQ(entries.size(), expected_types.size());
  for (const auto& [name, type] : expected_types) {
    ASSERT_TRUE(entries.count(name)) << name << " missing from readdir";
    EXPECT_EQ(entries[name].type, type) << "d_type of " << name;
    EXPECT_EQ(entries[name].ino, Lstat(P(name)).st_ino) << "d_ino of " << name;
  }
  EXPECT_EQ(entries["hard"].ino, entries["reg"].ino);
}

TEST_F(NamespaceTest, ReaddirListsTwoThousandEntriesExactlyOnce) {
  constexpr int kFiles = 2000;
  std::set<std::string> expected;
  for (int i = 0; i < kFiles; ++i) {
    std::string name = "file-with-a-longish-name-" + std::to_string(i);
    ASSERT_EQ(OpenClose(P(name), O_CREAT | O_EXCL | O_WRONLY), 0) << name << ": " << ErrnoName(errno);
    expected.insert(name);
  }
  EXPECT_EQ(ListDir(dir_), expected);  // ListDir also fails on a duplicate.
  EXPECT_EQ(Stat(dir_).st_nlink, 2u);

  // Remove every fourth entry and add new ones; a fresh listing is exact.
  for (int i = 0; i < kFiles; i += 4) {
    std::string name = "file-with-a-longish-name-" + std::to_string(i);
    ASSERT_EQ(unlink(P(name).c_str()), 0) << name;
    expected.erase(name);
  }
  for (int i = 0; i < 100; ++i) {
    std::string name = "added-" + std::to_string(i);
    ASSERT_EQ(mkdir(P(name).c_str(), 0755), 0) << name;
    expected.insert(name);
  }
  EXPECT_EQ(ListDir(dir_), expected);
  EXPECT_EQ(Stat(dir_).st_nlink, 102u);
}

TEST_F(NamespaceTest, RewinddirSeesEntriesAddedAndRemoved) {
  WriteFile(P("a"), "");
  WriteFile(P("b"), "");
  DIR* dir = opendir(dir_.c_str());
  ASSERT_NE(dir, nullptr);
  auto read_all = [&] {
    std::set<std::string> names;
    while (struct dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.insert(name);
    }
    return names;
  };
  EXPECT_EQ(read_all(), (std::set<std::string>{"a", "b"}));
  WriteFile(P("c"), "");
  ASSERT_EQ(unlink(P("a").c_str()), 0);
  rewinddir(dir);
  EXPECT_EQ(read_all(), (std::set<std::string>{"b", "c"}));
  closedir(dir);
}

TEST_F(NamespaceTest, UnlinkingEntriesWhileIteratingVisitsEveryOtherEntryOnce) {
  // POSIX: an entry that is neither added nor removed during the iteration is
  // returned exactly once. This is the `rm -r` pattern: unlink each entry as
  // it is returned, and at the end nothing is left.
  constexpr int kFiles = 2000;
  for (int i = 0; i < kFiles; ++i) {
    ASSERT_EQ(OpenClose(P("entry" + std::to_string(i)), O_CREAT | O_EXCL | O_WRONLY), 0);
  }
  DIR* dir = opendir(dir_.c_str());
  ASSERT_NE(dir, nullptr);
  std::set<std::string> seen;
  int unlink_failures = 0;
  while (struct dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    EXPECT_TRUE(seen.insert(name).second) << name << " returned twice";
    if (unlink(P(name).c_str()) != 0) ++unlink_failures;
  }
  closedir(dir);
  EXPECT_EQ(unlink_failures, 0);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kFiles));
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{});
  EXPECT_ERRNO(0, rmdir(dir_.c_str()));
  EXPECT_ERRNO(0, mkdir(dir_.c_str(), 0755));
}

TEST_F(NamespaceTest, SeekdirReturnsToATelldirPosition) {
  for (int i = 0; i < 300; ++i) WriteFile(P("f" + std::to_string(i)), "");
  DIR* dir = opendir(dir_.c_str());
  ASSERT_NE(dir, nullptr);
  std::vector<std::pair<long, std::string>> positions;
  for (;;) {
    long pos = telldir(dir);
    struct dirent* e = readdir(dir);
    if (e == nullptr) break;
    positions.emplace_back(pos, e->d_name);
  }
  ASSERT_EQ(positions.size(), 302u);
  for (size_t i : {size_t{0}, size_t{1}, size_t{150}, size_t{299}, size_t{301}}) {
    seekdir(dir, positions[i].first);
    struct dirent* e = readdir(dir);
    ASSERT_NE(e, nullptr) << "after seekdir to position " << i;
    EXPECT_EQ(std::string(e->d_name), positions[i].second) << "after seekdir to position " << i;
  }
  closedir(dir);
}

// The kernel keeps a directory's listing (FOPEN_CACHE_DIR) between opens:
// every change of the directory through the mount must show in the next
// listing, and in a rewinddir of a handle opened before it, in both
// directories of a rename.
TEST_F(NamespaceTest, ListingsFollowEveryChangeOfTheDirectory) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("e").c_str(), 0755), 0);
  std::set<std::string> d, e;
  auto check = [&](const char* after) {
    EXPECT_EQ(ListDir(P("d")), d) << "after " << after;
    EXPECT_EQ(ListDir(P("e")), e) << "after " << after;
  };
  check("mkdir");
  check("a second listing");
  WriteFile(P("d/f"), "x");
  d.insert("f");
  check("create");
  ASSERT_EQ(mkdir(P("d/sub").c_str(), 0755), 0);
  d.insert("sub");
  check("mkdir inside");
  ASSERT_EQ(symlink("f", P("d/lnk").c_str()), 0);
  d.insert("lnk");
  check("symlink");
  ASSERT_EQ(mknod(P("d/fifo").c_str(), S_IFIFO | 0644, 0), 0);
  d.insert("fifo");
  check("mknod");
  ASSERT_EQ(link(P("d/f").c_str(), P("e/hard").c_str()), 0);
  e.insert("hard");
  check("link into the other directory");
  ASSERT_EQ(rename(P("d/f").c_str(), P("d/g").c_str()), 0);
  d.erase("f");
  d.insert("g");
  check("rename within");
  ASSERT_EQ(rename(P("d/g").c_str(), P("e/g").c_str()), 0);
  d.erase("g");
  e.insert("g");
  check("rename across");
  ASSERT_EQ(renameat2(AT_FDCWD, P("d/lnk").c_str(), AT_FDCWD, P("e/hard").c_str(), RENAME_EXCHANGE), 0);
  check("rename exchange (same names, other inodes)");
  EXPECT_EQ(ListDirWithDots(P("e"))["hard"].type, DT_LNK);
  EXPECT_EQ(ListDirWithDots(P("d"))["lnk"].type, DT_REG);

  DIR* held = opendir(P("d").c_str());
  ASSERT_NE(held, nullptr);
  while (readdir(held) != nullptr) {
  }
  ASSERT_EQ(unlink(P("d/fifo").c_str()), 0);
  d.erase("fifo");
  ASSERT_EQ(rmdir(P("d/sub").c_str()), 0);
  d.erase("sub");
  check("unlink and rmdir");
  rewinddir(held);
  std::set<std::string> rewound;
  while (struct dirent* entry = readdir(held)) {
    if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") rewound.insert(entry->d_name);
  }
  closedir(held);
  EXPECT_EQ(rewound, d) << "rewinddir of a handle opened before the unlink and rmdir";
}

// ------------------------------------------------------------------ link counts

TEST_F(NamespaceTest, DirectoryLinkCountIsTwoPlusSubdirectories) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(mkdir(P("d" + std::to_string(i)).c_str(), 0755), 0);
    WriteFile(P("f" + std::to_string(i)), "");
  }
  ASSERT_EQ(symlink("d0", P("l").c_str()), 0);
  EXPECT_EQ(Stat(dir_).st_nlink, 7u);
  ASSERT_EQ(rmdir(P("d0").c_str()), 0);
  ASSERT_EQ(rename(P("d1").c_str(), P("d2/d1").c_str()), 0);
  EXPECT_EQ(Stat(dir_).st_nlink, 5u);
  EXPECT_EQ(Stat(P("d2")).st_nlink, 3u);
  EXPECT_EQ(Stat(P("d2/d1")).st_nlink, 2u);
}

// ------------------------------------------------------------------ name length

TEST_F(NamespaceTest, NamesUpTo255BytesWorkAnd256AreTooLong) {
  std::string ok(255, 'n');
  std::string too_long(256, 'n');
  WriteFile(P("file"), "x");

  EXPECT_ERRNO(0, OpenClose(P(ok), O_CREAT | O_EXCL | O_WRONLY));
  EXPECT_EQ(ListDir(dir_), (std::set<std::string>{"file", ok}));
  EXPECT_TRUE(S_ISREG(Stat(P(ok)).st_mode));
  EXPECT_ERRNO(0, unlink(P(ok).c_str()));
  EXPECT_ERRNO(0, mkdir(P(ok).c_str(), 0755));
  EXPECT_ERRNO(0, rmdir(P(ok).c_str()));

  struct stat st {};
  EXPECT_ERRNO(ENAMETOOLONG, OpenClose(P(too_long), O_CREAT | O_WRONLY));
  EXPECT_ERRNO(ENAMETOOLONG, OpenClose(P(too_long), O_RDONLY));
  EXPECT_ERRNO(ENAMETOOLONG, stat(P(too_long).c_str(), &st));
  EXPECT_ERRNO(ENAMETOOLONG, mkdir(P(too_long).c_str(), 0755));
  EXPECT_ERRNO(ENAMETOOLONG, mknod(P(too_long).c_str(), S_IFIFO | 0644, 0));
  EXPECT_ERRNO(ENAMETOOLONG, symlink("file", P(too_long).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, link(P("file").c_str(), P(too_long).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, rename(P("file").c_str(), P(too_long).c_str()));
  EXPECT_ERRNO(ENAMETOOLONG, unlink(P(too_long).c_str()));
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{"file"});

  struct statvfs sv {};
  ASSERT_EQ(statvfs(dir_.c_str(), &sv), 0);
  EXPECT_EQ(sv.f_namemax, 255u);
}

// ------------------------------------------------------------ open-unlinked

TEST_F(NamespaceTest, OpenUnlinkedFileKeepsWorkingUntilClose) {
  std::string data = RandomBytes(3 * kMiB + 123, 7);
  Fd fd(open(P("f").c_str(), O_CREAT | O_RDWR, 0600));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), data));
  Fd second(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(second.valid());
  ino_t ino = Stat(P("f")).st_ino;

  ASSERT_EQ(unlink(P("f").c_str()), 0);
  struct stat st {};
  EXPECT_ERRNO(ENOENT, stat(P("f").c_str(), &st));
  EXPECT_EQ(ListDir(dir_), std::set<std::string>{});

  ASSERT_EQ(fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_ino, ino);
  EXPECT_EQ(st.st_size, static_cast<off_t>(data.size()));
  EXPECT_EQ(ReadAll(fd.get()), data);

  // Keep writing, truncating and syncing it.
  std::string more = RandomBytes(kMiB, 8);
  ASSERT_TRUE(WriteAll(fd.get(), more, 2 * kMiB));
  data.replace(2 * kMiB, more.size(), more);
  EXPECT_ERRNO(0, fsync(fd.get()));
  EXPECT_EQ(ReadAll(second.get()), data);
  EXPECT_ERRNO(0, ftruncate(fd.get(), 1000));
  EXPECT_EQ(ReadAll(second.get()), data.substr(0, 1000));

  // The name is free again and refers to a new, independent file.
  WriteFile(P("f"), "new file");
  EXPECT_NE(Stat(P("f")).st_ino, ino);
  EXPECT_EQ(ReadAll(fd.get()), data.substr(0, 1000));

  // Closing one descriptor leaves the other working.
  EXPECT_EQ(fd.Close(), 0);
  EXPECT_EQ(ReadAll(second.get()), data.substr(0, 1000));
  ASSERT_EQ(fstat(second.get(), &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(second.Close(), 0);
  EXPECT_EQ(ReadFile(P("f")), "new file");
}

// ---------------------------------------------------------------------- statfs

TEST_F(NamespaceTest, StatfsReportsSaneNumbers) {
  struct statvfs sv {};
  ASSERT_EQ(statvfs(volume_->mountpoint().c_str(), &sv), 0) << ErrnoName(errno);
  EXPECT_GT(sv.f_bsize, 0u);
  EXPECT_GT(sv.f_frsize, 0u);
  EXPECT_GT(sv.f_blocks, 0u);
  EXPECT_LE(sv.f_bfree, sv.f_blocks);
  EXPECT_LE(sv.f_bavail, sv.f_bfree);
  // The volume was made with --size 1G: the data area is at most that, and
  // (like ext4's overhead of a few percent) not much less.
  uint64_t total = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  EXPECT_LE(total, 1024 * kMiB);
  EXPECT_GE(total, 900 * kMiB);
  EXPECT_EQ(sv.f_namemax, 255u);
}

TEST_F(NamespaceTest, FreeSpaceGoesDownAfterWritesAndBackAfterUnlink) {
  constexpr uint64_t kSize = 32 * kMiB;
  constexpr uint64_t kSlack = kMiB;  // metadata, and other tests' stragglers
  const std::string mnt = volume_->mountpoint();
  uint64_t before = FreeBytes(mnt);
  {
    Fd fd(open(P("big").c_str(), O_CREAT | O_WRONLY, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(WriteAll(fd.get(), RandomBytes(kSize, 99)));
    ASSERT_EQ(fsync(fd.get()), 0) << ErrnoName(errno);
  }
  uint64_t written = FreeBytes(mnt);
  EXPECT_LE(written + kSize, before + kSlack)
      << "free space before " << before << ", after writing " << kSize << " bytes " << written;

  ASSERT_EQ(unlink(P("big").c_str()), 0);
  uint64_t after = 0;
  EXPECT_TRUE(Eventually([&] { return (after = FreeBytes(mnt)) + kSlack >= before; }))
      << "free space before " << before << ", after write " << written << ", after unlink " << after;
}

TEST_F(NamespaceTest, SpaceOfOpenUnlinkedFileComesBackAtLastClose) {
  constexpr uint64_t kSize = 32 * kMiB;
  constexpr uint64_t kSlack = kMiB;
  const std::string mnt = volume_->mountpoint();
  uint64_t before = FreeBytes(mnt);
  Fd fd(open(P("big").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  std::string data = RandomBytes(kSize, 100);
  ASSERT_TRUE(WriteAll(fd.get(), data));
  ASSERT_EQ(fsync(fd.get()), 0) << ErrnoName(errno);
  ASSERT_EQ(unlink(P("big").c_str()), 0);

  uint64_t while_open = FreeBytes(mnt);
  EXPECT_LE(while_open + kSize, before + kSlack) << "an unlinked file's blocks stay allocated while it is open";
  EXPECT_EQ(ReadAll(fd.get()), data);

  ASSERT_EQ(fd.Close(), 0);
  uint64_t after = 0;
  EXPECT_TRUE(Eventually([&] { return (after = FreeBytes(mnt)) + kSlack >= before; }))
      << "free space before " << before << ", while open " << while_open << ", after close " << after;
}

}  // namespace
}  // namespace spillfs::testing
