// Persistence across unmount and mount, and the command line's refusals of bad
// input. A tree of files (sizes across block boundaries, random bytes, a
// sparse file), directories, symlinks, hard links, special files, modes,
// owners, times and xattrs is built, unmounted, mounted again and checked to
// be exactly as it was, as it would be on ext4. The CLI cases check that
// `spillfs` exits non-zero with a message and loses nothing.
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
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
#include "support/temp_dir.h"

namespace spillfs::testing {
namespace {

constexpr off_t kKiB = 1024;
constexpr off_t kMiB = 1024 * 1024;

std::set<std::string> ListDir(const std::string& path) {
  std::set<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    ADD_FAILURE() << "opendir " << path << ": " << ErrnoName(errno);
    return names;
  }
  while (struct dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != ".." && name != "lost+found") names.insert(name);
  }
  closedir(dir);
  return names;
}

std::map<std::string, std::string> Xattrs(const std::string& path) {
  std::map<std::string, std::string> out;
  ssize_t size = llistxattr(path.c_str(), nullptr, 0);
  if (size < 0) {
    ADD_FAILURE() << "llistxattr " << path << ": " << ErrnoName(errno);
    return out;
  }
  std::string names(size, '\0');
  size = llistxattr(path.c_str(), names.data(), names.size());
  if (size < 0) {
    ADD_FAILURE() << "llistxattr " << path << ": " << ErrnoName(errno);
    return out;
  }
  names.resize(size);
  for (size_t pos = 0; pos < names.size();) {
    size_t end = names.find('\0', pos);
    if (end == std::string::npos) break;
    std::string name = names.substr(pos, end - pos);
    pos = end + 1;
    std::string value(65536, '\0');
    ssize_t n = lgetxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (n < 0) {
      ADD_FAILURE() << "lgetxattr " << path << " " << name << ": " << ErrnoName(errno);
      continue;
    }
    value.resize(n);
    out[name] = value;
  }
  return out;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Undoes a mount that a test expected to be refused.
void UnmountIfMounted(const std::string& path) {
  if (!IsMountPoint(path)) return;
  if (RunSpillfs("umount " + path) != 0) umount2(path.c_str(), MNT_DETACH);
}

std::string Dirname(const std::string& path) {
  std::string copy = path;
  return dirname(copy.data());
}

// ------------------------------------------------------------------- the tree

enum class Kind { kDir, kFile, kSymlink, kSpecial };

struct Node {
  Kind kind = Kind::kFile;
  mode_t mode = 0;  // permission bits (and the file type for kSpecial)
  uid_t uid = 0;
  gid_t gid = 0;
  std::string data;  // file contents (holes as zeros) or symlink target
  dev_t rdev = 0;
  std::map<std::string, std::string> xattrs;
  timespec atime{};
  timespec mtime{};
};

Node MakeNode(Kind kind, mode_t mode, uid_t uid, gid_t gid) {
  Node node;
  node.kind = kind;
  node.mode = mode;
  node.uid = uid;
  node.gid = gid;
  return node;
}

// Builds a tree under a mountpoint and remembers what it built. Paths are
// relative to the mountpoint; "" is the mountpoint's root directory.
class Tree {
 public:
  explicit Tree(std::string mountpoint) : mnt_(std::move(mountpoint)) {}

  std::string Abs(const std::string& rel) const { return rel.empty() ? mnt_ : mnt_ + "/" + rel; }

  void Dir(const std::string& rel, mode_t mode, uid_t uid, gid_t gid) {
    if (!rel.empty()) {
      ASSERT_EQ(mkdir(Abs(rel).c_str(), 0700), 0) << rel << ": " << ErrnoName(errno);
    }
    Own(rel, uid, gid, mode);
    Add(rel, MakeNode(Kind::kDir, mode, uid, gid));
  }

  void File(const std::string& rel, const std::string& data, mode_t mode, uid_t uid, gid_t gid) {
    Sparse(rel, data.size(), {{0, data}}, mode, uid, gid);
  }

  // A file of SIZE bytes holding PIECES (offset, bytes), holes elsewhere.
  void Sparse(const std::string& rel, off_t size, const std::vector<std::pair<off_t, std::string>>& pieces, mode_t mode,
              uid_t uid, gid_t gid) {
    int fd = open(Abs(rel).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << rel << ": " << ErrnoName(errno);
    std::string contents(size, '\0');
    for (const auto& [offset, bytes] : pieces) {
      ASSERT_TRUE(WriteAll(fd, bytes, offset)) << rel << ": " << ErrnoName(errno);
      contents.replace(offset, bytes.size(), bytes);
    }
    ASSERT_EQ(ftruncate(fd, size), 0) << rel;
    ASSERT_EQ(fsync(fd), 0) << rel << ": " << ErrnoName(errno);
    ASSERT_EQ(close(fd), 0) << rel;
    Own(rel, uid, gid, mode);
    Node node = MakeNode(Kind::kFile, mode, uid, gid);
    node.data = std::move(contents);
    Add(rel, node);
  }

  void Symlink(const std::string& rel, const std::string& target, uid_t uid, gid_t gid) {
    ASSERT_EQ(symlink(target.c_str(), Abs(rel).c_str()), 0) << rel << ": " << ErrnoName(errno);
    ASSERT_EQ(lchown(Abs(rel).c_str(), uid, gid), 0) << rel << ": " << ErrnoName(errno);
    Node node = MakeNode(Kind::kSymlink, 0777, uid, gid);
    node.data = target;
    Add(rel, node);
  }

  void Special(const std::string& rel, mode_t type, mode_t mode, dev_t rdev, uid_t uid, gid_t gid) {
    ASSERT_EQ(mknod(Abs(rel).c_str(), type | 0600, rdev), 0) << rel << ": " << ErrnoName(errno);
    Own(rel, uid, gid, mode);
    Node node = MakeNode(Kind::kSpecial, type | mode, uid, gid);
    node.rdev = rdev;
    Add(rel, node);
  }

  void HardLink(const std::string& existing, const std::string& rel) {
    ASSERT_EQ(link(Abs(existing).c_str(), Abs(rel).c_str()), 0) << rel << ": " << ErrnoName(errno);
    primary_[rel] = Primary(existing);
    names_.push_back(rel);
  }

  void Xattr(const std::string& rel, const std::string& name, const std::string& value) {
    ASSERT_EQ(lsetxattr(Abs(rel).c_str(), name.c_str(), value.data(), value.size(), 0), 0)
        << rel << " " << name << ": " << ErrnoName(errno);
    nodes_[Primary(rel)].xattrs[name] = value;
  }

  // Gives every inode its own atime and mtime, with nanoseconds. Last, since
  // creating entries changes their parents' times.
  void SetTimes() {
    int64_t i = 0;
    for (auto& [rel, node] : nodes_) {
      ++i;
      node.atime = timespec{1000000000 + i * 1000, static_cast<long>(i * 7919 + 1)};
      node.mtime = timespec{1100000000 + i * 1000, static_cast<long>(i * 104729 + 2)};
      timespec times[2] = {node.atime, node.mtime};
      ASSERT_EQ(utimensat(AT_FDCWD, Abs(rel).c_str(), times, AT_SYMLINK_NOFOLLOW), 0)
          << rel << ": " << ErrnoName(errno);
    }
  }

  const std::vector<std::string>& names() const { return names_; }
  std::string Primary(const std::string& rel) const {
    auto it = primary_.find(rel);
    return it == primary_.end() ? rel : it->second;
  }
  const Node& NodeOf(const std::string& rel) const { return nodes_.at(Primary(rel)); }

  nlink_t ExpectedLinks(const std::string& rel) const {
    const Node& node = NodeOf(rel);
    if (node.kind == Kind::kDir) {
      nlink_t n = 2;
      // (ext4's root also holds lost+found; spillfs need not have one.)
      struct stat lf {};
      if (lstat(Abs(rel.empty() ? "lost+found" : rel + "/lost+found").c_str(), &lf) == 0) ++n;
      for (const auto& [other, other_node] : nodes_) {
        if (other_node.kind == Kind::kDir && !other.empty() && Parent(other) == rel) ++n;
      }
      return n;
    }
    nlink_t n = 0;
    for (const std::string& name : names_) n += Primary(name) == Primary(rel);
    return n;
  }

  std::set<std::string> Children(const std::string& dir) const {
    std::set<std::string> out;
    for (const std::string& name : names_) {
      if (!name.empty() && Parent(name) == dir) out.insert(name.substr(name.rfind('/') + 1));
    }
    return out;
  }

  static std::string Parent(const std::string& rel) {
    size_t slash = rel.rfind('/');
    return slash == std::string::npos ? "" : rel.substr(0, slash);
  }

 private:
  void Own(const std::string& rel, uid_t uid, gid_t gid, mode_t mode) {
    // chown first: it would clear S_ISUID/S_ISGID set before it.
    ASSERT_EQ(lchown(Abs(rel).c_str(), uid, gid), 0) << rel << ": " << ErrnoName(errno);
    ASSERT_EQ(chmod(Abs(rel).c_str(), mode & 07777), 0) << rel << ": " << ErrnoName(errno);
  }
  void Add(const std::string& rel, const Node& node) {
    nodes_[rel] = node;
    names_.push_back(rel);
  }

  std::string mnt_;
  std::map<std::string, Node> nodes_;           // by primary name
  std::map<std::string, std::string> primary_;  // hard link name -> primary name
  std::vector<std::string> names_;              // every name, in creation order
};

void BuildTree(Tree* t) {
  // The root directory itself.
  t->Dir("", 0751, 0, 100);
  t->Dir("a", 0755, 0, 0);
  t->Dir("a/b", 0700, 1000, 1000);
  t->Dir("a/b/c", 02775, 0, 50);
  t->Dir("sticky", 01777, 0, 0);
  t->Dir("deep", 0755, 0, 0);
  t->Dir("deep/1", 0755, 0, 0);
  t->Dir("deep/1/2", 0750, 5, 6);
  t->Dir("deep/1/2/3", 0500, 0, 0);
  t->Dir("emptydir", 0000, 123, 456);

  struct FileSpec {
    const char* path;
    size_t size;
    mode_t mode;
    uid_t uid;
    gid_t gid;
  };
  const FileSpec files[] = {
      {"a/zero", 0, 0644, 0, 0},
      {"a/one", 1, 0600, 0, 0},
      {"a/b/4095", 4095, 0755, 1000, 1000},
      {"a/b/4096", 4096, 04755, 0, 0},
      {"a/b/c/4097", 4097, 02750, 0, 50},
      {"a/64k", 64 * kKiB, 0444, 65534, 65534},
      {"a/64k+1", 64 * kKiB + 1, 0000, 123, 456},
      {"mib-1", kMiB - 1, 0640, 0, 0},
      {"mib+1", kMiB + 1, 06755, 0, 0},
      {"big", 3 * kMiB + 12345, 0644, 1, 2},
      {"deep/1/2/3/leaf", 12345, 01644, 0, 0},
  };
  uint64_t seed = 1000;
  for (const FileSpec& f : files) {
    t->File(f.path, RandomBytes(f.size, ++seed), f.mode, f.uid, f.gid);
  }
  t->Sparse("sparse", 16 * kMiB + 100 + 8 * kKiB,
            {{0, RandomBytes(4 * kKiB, 77)}, {16 * kMiB + 100, RandomBytes(8 * kKiB, 78)}}, 0644, 0, 0);
  t->Sparse("sparse-tail", 8 * kMiB, {{kMiB, RandomBytes(5000, 79)}}, 0600, 0, 0);

  t->Symlink("a/rel", "../big", 0, 0);
  t->Symlink("abs", "/etc/passwd", 7, 8);
  t->Symlink("dangling", "nowhere/at/all", 0, 0);
  std::string long_target;
  while (long_target.size() < 1000) long_target += "segment/";
  t->Symlink("a/b/long", long_target, 1000, 1000);

  t->HardLink("a/one", "a/b/one-link");
  t->HardLink("a/one", "hl");
  t->HardLink("big", "sticky/big-link");

  t->Special("fifo", S_IFIFO, 0620, 0, 0, 0);
  t->Special("chr", S_IFCHR, 0600, makedev(1, 7), 0, 0);
  t->Special("blk", S_IFBLK, 0660, makedev(259, 3), 0, 6);
  t->Special("sock", S_IFSOCK, 0755, 0, 1000, 1000);

  t->Xattr("a/one", "user.a", "1");
  t->Xattr("a/one", "user.bin", std::string("\0\1\2\xff\0", 5));
  t->Xattr("a/one", "user.empty", "");
  t->Xattr("a/b", "user.dir", "directory value");
  t->Xattr("big", "trusted.t", "trusted value");
  t->Xattr("big", "user.large", RandomBytes(2000, 80));
  t->Xattr("abs", "trusted.link", "on a symlink");
  t->Xattr("fifo", "trusted.fifo", "on a fifo");
  t->Xattr("", "user.root", "on the root");

  t->SetTimes();
}

struct Snapshot {
  std::map<std::string, struct stat> stats;
  std::map<std::string, std::map<std::string, std::string>> xattrs;
};

// Only calls that leave atime alone: lstat and xattrs.
Snapshot Take(const Tree& t) {
  Snapshot s;
  for (const std::string& rel : t.names()) {
    struct stat st {};
    EXPECT_EQ(lstat(t.Abs(rel).c_str(), &st), 0) << rel << ": " << ErrnoName(errno);
    s.stats[rel] = st;
    s.xattrs[rel] = Xattrs(t.Abs(rel));
  }
  return s;
}

int64_t Ns(const timespec& ts) { return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec; }

// Checks attributes against what was built, without reading any data.
void CheckAttributes(const Tree& t, const Snapshot& s) {
  for (const std::string& rel : t.names()) {
    SCOPED_TRACE("'" + rel + "'");
    const Node& node = t.NodeOf(rel);
    const struct stat& st = s.stats.at(rel);
    switch (node.kind) {
      case Kind::kDir:
        EXPECT_TRUE(S_ISDIR(st.st_mode));
        break;
      case Kind::kFile:
        EXPECT_TRUE(S_ISREG(st.st_mode));
        EXPECT_EQ(st.st_size, static_cast<off_t>(node.data.size()));
        break;
      case Kind::kSymlink:
        EXPECT_TRUE(S_ISLNK(st.st_mode));
        EXPECT_EQ(st.st_size, static_cast<off_t>(node.data.size()));
        break;
      case Kind::kSpecial:
        EXPECT_EQ(st.st_mode & S_IFMT, node.mode & S_IFMT);
        EXPECT_EQ(st.st_rdev, node.rdev);
        break;
    }
    EXPECT_EQ(st.st_mode & 07777, node.mode & 07777);
    EXPECT_EQ(st.st_uid, node.uid);
    EXPECT_EQ(st.st_gid, node.gid);
    EXPECT_EQ(st.st_nlink, t.ExpectedLinks(rel));
    EXPECT_EQ(Ns(st.st_atim), Ns(node.atime)) << "atime";
    EXPECT_EQ(Ns(st.st_mtim), Ns(node.mtime)) << "mtime";
    EXPECT_EQ(s.xattrs.at(rel), node.xattrs);
    EXPECT_EQ(st.st_ino, s.stats.at(t.Primary(rel)).st_ino) << "hard links share an inode";
  }
}

// Checks that AFTER equals BEFORE in everything a remount must keep.
void CheckSame(const Snapshot& before, const Snapshot& after) {
  for (const auto& [rel, b] : before.stats) {
    SCOPED_TRACE("'" + rel + "'");
    const struct stat& a = after.stats.at(rel);
    EXPECT_EQ(a.st_ino, b.st_ino);
    EXPECT_EQ(a.st_mode, b.st_mode);
    EXPECT_EQ(a.st_nlink, b.st_nlink);
    EXPECT_EQ(a.st_uid, b.st_uid);
    EXPECT_EQ(a.st_gid, b.st_gid);
    EXPECT_EQ(a.st_rdev, b.st_rdev);
    EXPECT_EQ(a.st_size, b.st_size);
    EXPECT_EQ(a.st_blocks, b.st_blocks);
    EXPECT_EQ(Ns(a.st_atim), Ns(b.st_atim)) << "atime";
    EXPECT_EQ(Ns(a.st_mtim), Ns(b.st_mtim)) << "mtime";
    EXPECT_EQ(Ns(a.st_ctim), Ns(b.st_ctim)) << "ctime";
    EXPECT_EQ(after.xattrs.at(rel), before.xattrs.at(rel));
  }
}

// Reads every file and symlink and lists every directory.
void CheckContents(const Tree& t) {
  for (const std::string& rel : t.names()) {
    SCOPED_TRACE("'" + rel + "'");
    const Node& node = t.NodeOf(rel);
    if (node.kind == Kind::kFile) {
      std::string data = ReadFile(t.Abs(rel));
      EXPECT_EQ(data.size(), node.data.size());
      EXPECT_TRUE(data == node.data) << "contents differ";
    } else if (node.kind == Kind::kSymlink) {
      std::string buf(8192, '\0');
      ssize_t n = readlink(t.Abs(rel).c_str(), buf.data(), buf.size());
      ASSERT_GE(n, 0) << ErrnoName(errno);
      EXPECT_EQ(buf.substr(0, n), node.data);
    } else if (node.kind == Kind::kDir) {
      EXPECT_EQ(ListDir(t.Abs(rel)), t.Children(rel));
    }
  }
}

TEST(PersistenceTest, EverythingSurvivesRemount) {
  umask(0);
  MountedVolume volume;
  Tree tree(volume.mountpoint());
  ASSERT_NO_FATAL_FAILURE(BuildTree(&tree));

  Snapshot before = Take(tree);
  {
    SCOPED_TRACE("before remount");
    CheckAttributes(tree, before);
  }
  struct statvfs sv_before {};
  ASSERT_EQ(statvfs(volume.mountpoint().c_str(), &sv_before), 0);

  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;

  Snapshot after = Take(tree);
  {
    SCOPED_TRACE("after remount");
    CheckSame(before, after);
    CheckAttributes(tree, after);
    CheckContents(tree);
  }
  struct statvfs sv_after {};
  ASSERT_EQ(statvfs(volume.mountpoint().c_str(), &sv_after), 0);
  EXPECT_EQ(sv_after.f_blocks, sv_before.f_blocks);
  EXPECT_EQ(sv_after.f_bfree, sv_before.f_bfree) << "free space changed across the remount";
  EXPECT_EQ(sv_after.f_files, sv_before.f_files);
  EXPECT_EQ(sv_after.f_ffree, sv_before.f_ffree);

  // Still usable, and a new file gets an inode number no live file has.
  std::set<ino_t> inos;
  for (const auto& [rel, st] : after.stats) inos.insert(st.st_ino);
  for (int i = 0; i < 20; ++i) {
    std::string path = tree.Abs("new" + std::to_string(i));
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << ErrnoName(errno);
    ASSERT_TRUE(WriteAll(fd, "new"));
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    close(fd);
    EXPECT_TRUE(inos.insert(st.st_ino).second) << "inode number " << st.st_ino << " reused";
    EXPECT_EQ(ReadFile(path), "new");
  }
}

TEST(PersistenceTest, ModificationsSurviveRemount) {
  umask(0);
  MountedVolume volume;
  auto p = [&](const std::string& rel) { return volume.Path(rel); };
  std::string data = RandomBytes(2 * kMiB, 5);
  {
    int fd = open(p("f").c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(WriteAll(fd, data));
    close(fd);
  }
  int fd = open(p("gone").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, RandomBytes(kMiB, 6)));
  close(fd);
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("d/sub").c_str(), 0755), 0);
  ASSERT_EQ(setxattr(p("f").c_str(), "user.keep", "k", 1, 0), 0) << ErrnoName(errno);
  ASSERT_EQ(setxattr(p("f").c_str(), "user.drop", "d", 1, 0), 0);
  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;
  uint64_t free_with_gone = FreeBytes(volume.mountpoint());

  // Overwrite the middle, truncate, rename, unlink, remove an xattr, rmdir.
  std::string patch = RandomBytes(100000, 7);
  fd = open(p("f").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, patch, 500000));
  ASSERT_EQ(ftruncate(fd, kMiB + 5), 0);
  close(fd);
  data.replace(500000, patch.size(), patch);
  data.resize(kMiB + 5);
  ASSERT_EQ(rename(p("f").c_str(), p("d/f2").c_str()), 0);
  ASSERT_EQ(unlink(p("gone").c_str()), 0);
  ASSERT_EQ(removexattr(p("d/f2").c_str(), "user.drop"), 0);
  ASSERT_EQ(rmdir(p("d/sub").c_str()), 0);
  ASSERT_EQ(symlink("f2", p("d/link").c_str()), 0);
  ASSERT_TRUE(volume.Remount(&error)) << error;

  EXPECT_EQ(ListDir(volume.mountpoint()), std::set<std::string>{"d"});
  EXPECT_EQ(ListDir(p("d")), (std::set<std::string>{"f2", "link"}));
  EXPECT_EQ(Xattrs(p("d/f2")), (std::map<std::string, std::string>{{"user.keep", "k"}}));
  std::string read = ReadFile(p("d/f2"));
  EXPECT_EQ(read.size(), data.size());
  EXPECT_TRUE(read == data) << "contents after overwrite+truncate+remount differ";
  struct stat st {};
  ASSERT_EQ(stat(p("d").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);
  EXPECT_EQ(ReadFile(p("d/link")), data);
  EXPECT_GE(FreeBytes(volume.mountpoint()) + 64 * kKiB, free_with_gone + kMiB)
      << "the unlinked file's space must stay free after remount";
}

TEST(PersistenceTest, FsyncedDataSurvivesADaemonCrash) {
  umask(0);
  MountedVolume volume;
  std::string data = RandomBytes(3 * kMiB + 17, 11);
  int fd = open(volume.Path("durable").c_str(), O_CREAT | O_WRONLY, 0640);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, data));
  ASSERT_EQ(fsync(fd), 0) << ErrnoName(errno);
  close(fd);
  ASSERT_EQ(mkdir(volume.Path("dir").c_str(), 0700), 0);
  int dfd = open(volume.Path("dir").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  fd = open(volume.Path("dir/entry").c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, "entry"));
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  ASSERT_EQ(fsync(dfd), 0) << ErrnoName(errno);
  close(dfd);

  volume.Kill();
  std::string error;
  ASSERT_TRUE(volume.Mount(&error)) << "mount after a crash: " << error;
  EXPECT_EQ(ReadFile(volume.Path("durable")), data);
  struct stat st {};
  ASSERT_EQ(stat(volume.Path("durable").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(ReadFile(volume.Path("dir/entry")), "entry");
}

TEST(PersistenceTest, OrphanOfACrashIsReclaimedAtMount) {
  umask(0);
  MountedVolume volume;
  uint64_t before = FreeBytes(volume.mountpoint());
  int fd = open(volume.Path("orphan").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, RandomBytes(32 * kMiB, 12)));
  ASSERT_EQ(fsync(fd), 0);
  ASSERT_EQ(unlink(volume.Path("orphan").c_str()), 0);
  EXPECT_LE(FreeBytes(volume.mountpoint()) + 31 * kMiB, before) << "held while open";

  volume.Kill();  // the file is still open: an orphan
  close(fd);
  std::string error;
  ASSERT_TRUE(volume.Mount(&error)) << "mount after a crash: " << error;
  uint64_t after = 0;
  EXPECT_TRUE(Eventually([&] { return (after = FreeBytes(volume.mountpoint())) + kMiB >= before; }))
      << "free before " << before << ", after crash and mount " << after;
  EXPECT_EQ(ListDir(volume.mountpoint()), std::set<std::string>{});
}

// Options whose flusher waits an hour: a file closed stays unflushed, and
// so unsettled if new, until a sync.
MountedVolume::Options WithoutAgeFlush() {
  MountedVolume::Options options;
  options.mount_args = {"--flush-age", "3600000"};
  return options;
}

// fsync(2) of `path`, opened read-only.
void FsyncPath(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path << ": " << ErrnoName(errno);
  EXPECT_EQ(fsync(fd), 0) << path << ": " << ErrnoName(errno);
  close(fd);
}

// A file created since the last sync is closed without waiting for the SSD
// (kInodeUnsettled, docs/design.md "Crash order"): after a crash it is
// absent, never there without its bytes; everything synced before is whole.
// The flusher waits an hour here (WithoutAgeFlush), so the unsettled file is
// certain to be unflushed at the kill.
TEST(PersistenceTest, AFileCreatedAndClosedSinceTheLastSyncIsAbsentAfterACrash) {
  MountedVolume volume(WithoutAgeFlush());
  std::string synced = RandomBytes(300 * kKiB + 5, 21);
  WriteFile(volume.Path("synced"), synced);
  FsyncPath(volume.Path("synced"));
  WriteFile(volume.Path("unsynced"), RandomBytes(200 * kKiB, 22));  // created, written, closed

  volume.Kill();
  std::string error;
  ASSERT_TRUE(volume.Mount(&error)) << "mount after a crash: " << error;
  EXPECT_EQ(ReadFile(volume.Path("synced")), synced);
  EXPECT_EQ(ListDir(volume.mountpoint()), std::set<std::string>{"synced"});
}

// An fsync of any file settles every file created before it, and a rename
// that replaces a name settles the file that takes it: after a crash both
// are whole, and the replaced name is never lost.
TEST(PersistenceTest, AnFsyncOrAReplacingRenameSettlesFilesClosedBefore) {
  MountedVolume volume(WithoutAgeFlush());
  std::string first = RandomBytes(100 * kKiB + 3, 23);
  WriteFile(volume.Path("closed-before-an-fsync"), first);
  std::string other = RandomBytes(10 * kKiB, 24);
  WriteFile(volume.Path("other"), other);
  FsyncPath(volume.Path("other"));
  // After that fsync: a new file replaces "other" by rename, with no fsync.
  std::string replacement = RandomBytes(64 * kKiB + 9, 25);
  WriteFile(volume.Path("new"), replacement);
  ASSERT_EQ(rename(volume.Path("new").c_str(), volume.Path("other").c_str()), 0) << ErrnoName(errno);

  volume.Kill();
  std::string error;
  ASSERT_TRUE(volume.Mount(&error)) << "mount after a crash: " << error;
  EXPECT_EQ(ReadFile(volume.Path("closed-before-an-fsync")), first);
  EXPECT_EQ(ReadFile(volume.Path("other")), replacement);
  EXPECT_EQ(ListDir(volume.mountpoint()), (std::set<std::string>{"closed-before-an-fsync", "other"}));
}

// A clean unmount settles every file: a crash after the next mount does not
// reclaim files that a clean unmount made durable.
TEST(PersistenceTest, ACleanUnmountSettlesEveryFile) {
  MountedVolume volume(WithoutAgeFlush());
  std::string data = RandomBytes(50 * kKiB, 26);
  WriteFile(volume.Path("written"), data);
  WriteFile(volume.Path("empty"), "");
  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;
  volume.Kill();
  ASSERT_TRUE(volume.Mount(&error)) << "mount after a crash: " << error;
  EXPECT_EQ(ReadFile(volume.Path("written")), data);
  EXPECT_EQ(ReadFile(volume.Path("empty")), "");
}

// ------------------------------------------------------------------------ CLI

// Expects `spillfs ARGS` to fail with a message.
void ExpectRefused(const std::string& args) {
  std::string output;
  int rc = RunSpillfs(args, &output);
  EXPECT_NE(rc, 0) << "spillfs " << args << " succeeded: " << output;
  EXPECT_NE(Trim(output), "") << "spillfs " << args << " failed (" << rc << ") without a message";
}

TEST(CliTest, SecondMountOfAMountedVolumeIsRefused) {
  MountedVolume volume;
  TempDir tmp("spillfs-cli");
  ASSERT_EQ(mkdir(tmp.Path("mnt2").c_str(), 0755), 0);
  ExpectRefused("mount " + volume.volume() + " " + tmp.Path("mnt2"));
  EXPECT_FALSE(IsMountPoint(tmp.Path("mnt2")));
  UnmountIfMounted(tmp.Path("mnt2"));

  // The first mount is untouched.
  int fd = open(volume.Path("f").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << ErrnoName(errno);
  ASSERT_TRUE(WriteAll(fd, "still mounted"));
  close(fd);
  EXPECT_EQ(ReadFile(volume.Path("f")), "still mounted");
  std::string error;
  EXPECT_TRUE(volume.Unmount(&error)) << error;
}

TEST(CliTest, MountOnAMissingMountpointIsRefused) {
  MountedVolume volume;
  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  std::string missing = Dirname(volume.volume()) + "/no-such-dir";
  ExpectRefused("mount " + volume.volume() + " " + missing);
  EXPECT_FALSE(IsMountPoint(missing));
  UnmountIfMounted(missing);
  // The failed attempt left no lock behind.
  EXPECT_TRUE(volume.Mount(&error)) << error;
}

TEST(CliTest, MountOnABusyMountpointIsRefused) {
  MountedVolume first;
  MountedVolume second;
  std::string error;
  ASSERT_TRUE(second.Unmount(&error)) << error;
  int fd = open(first.Path("mine").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, "first"));
  close(fd);
  ExpectRefused("mount " + second.volume() + " " + first.mountpoint());
  // Whatever happened, the mountpoint still shows the first volume.
  struct stat st {};
  bool stacked = stat(first.Path("mine").c_str(), &st) != 0;
  EXPECT_FALSE(stacked) << "the second volume was mounted over the first";
  if (stacked) UnmountIfMounted(first.mountpoint());
  EXPECT_EQ(ReadFile(first.Path("mine")), "first");
}

TEST(CliTest, MkfsOnAnExistingVolumeNeedsForce) {
  MountedVolume volume;
  int fd = open(volume.Path("precious").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, "precious data"));
  close(fd);
  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;

  ExpectRefused("mkfs " + volume.volume() + " --size 1G");
  ASSERT_TRUE(volume.Mount(&error)) << error;
  EXPECT_EQ(ReadFile(volume.Path("precious")), "precious data") << "a refused mkfs lost data";
  ASSERT_TRUE(volume.Unmount(&error)) << error;

  std::string output;
  EXPECT_EQ(RunSpillfs("mkfs " + volume.volume() + " --size 1G --force", &output), 0) << output;
  ASSERT_TRUE(volume.Mount(&error)) << error;
  EXPECT_EQ(ListDir(volume.mountpoint()), std::set<std::string>{}) << "mkfs --force makes an empty volume";
}

TEST(CliTest, MkfsWithABadSizeIsRefused) {
  TempDir tmp("spillfs-cli");
  ExpectRefused("mkfs " + tmp.Path("tiny") + " --size 1M");
  ExpectRefused("mkfs " + tmp.Path("zero") + " --size 0");
  ExpectRefused("mkfs " + tmp.Path("junk") + " --size lots");
  // Control: a sane size works.
  std::string output;
  EXPECT_EQ(RunSpillfs("mkfs " + tmp.Path("ok") + " --size 256M", &output), 0) << output;
}

TEST(CliTest, MountingSomethingThatIsNotAVolumeIsRefused) {
  TempDir tmp("spillfs-cli");
  ASSERT_EQ(mkdir(tmp.Path("mnt").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(tmp.Path("notvol").c_str(), 0755), 0);
  int fd = open(tmp.Path("notvol/hello.txt").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAll(fd, "hello"));
  close(fd);
  ASSERT_EQ(mkdir(tmp.Path("empty").c_str(), 0755), 0);

  ExpectRefused("mount " + tmp.Path("notvol") + " " + tmp.Path("mnt"));
  UnmountIfMounted(tmp.Path("mnt"));
  ExpectRefused("mount " + tmp.Path("empty") + " " + tmp.Path("mnt"));
  UnmountIfMounted(tmp.Path("mnt"));
  ExpectRefused("mount " + tmp.Path("missing") + " " + tmp.Path("mnt"));
  UnmountIfMounted(tmp.Path("mnt"));
  ExpectRefused("mount " + tmp.Path("notvol/hello.txt") + " " + tmp.Path("mnt"));
  UnmountIfMounted(tmp.Path("mnt"));

  // Nothing was created in them.
  EXPECT_EQ(ListDir(tmp.Path("notvol")), std::set<std::string>{"hello.txt"});
  EXPECT_EQ(ReadFile(tmp.Path("notvol/hello.txt")), "hello");
  EXPECT_EQ(ListDir(tmp.Path("empty")), std::set<std::string>{});
  struct stat st {};
  EXPECT_NE(stat(tmp.Path("missing").c_str(), &st), 0);
}

TEST(CliTest, MismatchedIndexAndImageAreRefused) {
  TempDir tmp("spillfs-cli");
  std::string output;
  ASSERT_EQ(RunSpillfs("mkfs " + tmp.Path("a") + " --size 256M", &output), 0) << output;
  ASSERT_EQ(RunSpillfs("mkfs " + tmp.Path("b") + " --size 256M", &output), 0) << output;
  ASSERT_EQ(mkdir(tmp.Path("mnt").c_str(), 0755), 0);
  // The issue fixes the layout: VOLUME/data.img and VOLUME/index/.
  ASSERT_EQ(access(tmp.Path("a/data.img").c_str(), F_OK), 0) << ErrnoName(errno);
  ASSERT_EQ(rename(tmp.Path("b/data.img").c_str(), tmp.Path("a/data.img").c_str()), 0);
  ExpectRefused("mount " + tmp.Path("a") + " " + tmp.Path("mnt"));
  UnmountIfMounted(tmp.Path("mnt"));
}

}  // namespace
}  // namespace spillfs::testing
