// Unit tests of the POSIX core's namespace operations (core/namespace_ops.cc):
// create, lookup, links, readdir, rename, unlink, and open-unlinked files and
// the orphans they leave.
#include <gtest/gtest.h>
#include <linux/fs.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "filesystem_fixture.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using testing::RandomBytes;

INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName);

// ---- create, lookup, links, readdir ----

// The record cache (Filesystem::LoadInode) answers what the index holds after
// every kind of commit: attributes, links, renames, unlinks, and the same
// after a reopen (which starts with an empty cache).
TEST_F(FilesystemTest, RecordCacheAnswersWhatTheIndexHolds) {
  InodeNumber dir = MakeDir(kRootInode, "d");
  InodeNumber f = MakeFile(dir, "f");
  auto same_as_index = [&](InodeNumber ino, const char* after) {
    auto entry = fs_->GetAttr(ino);
    auto record = index().GetInode(ino);
    ASSERT_TRUE(entry.ok()) << after << ": " << entry.status().ToString();
    ASSERT_TRUE(record.ok()) << after << ": " << record.status().ToString();
    EXPECT_EQ(entry->attr.st_mode, record->mode) << after;
    EXPECT_EQ(entry->attr.st_nlink, record->nlink) << after;
    EXPECT_EQ(entry->attr.st_uid, record->uid) << after;
    EXPECT_EQ(static_cast<int64_t>(entry->attr.st_ctim.tv_sec) * 1000000000 + entry->attr.st_ctim.tv_nsec,
              record->ctime_ns)
        << after;
  };
  same_as_index(f, "create");
  SetAttrRequest chmod;
  chmod.mode = 0604;
  ASSERT_TRUE(fs_->SetAttr(f, chmod).ok());
  same_as_index(f, "chmod");
  EXPECT_EQ(fs_->GetAttr(f)->attr.st_mode & 07777, 0604u);
  SetAttrRequest chown;
  chown.uid = 1234;
  ASSERT_TRUE(fs_->SetAttr(f, chown).ok());
  same_as_index(f, "chown");
  ASSERT_TRUE(fs_->Link(f, kRootInode, "hard").ok());
  same_as_index(f, "link");
  same_as_index(kRootInode, "link (the directory)");
  ExpectRenamed(dir, "f", kRootInode, "g", f);
  same_as_index(f, "rename");
  same_as_index(dir, "rename (the source directory)");
  ASSERT_TRUE(fs_->Unlink(kRootInode, "hard").ok());
  same_as_index(f, "unlink of one of two links");
  EXPECT_EQ(fs_->GetAttr(f)->attr.st_nlink, 1u);
  ASSERT_TRUE(fs_->Unlink(kRootInode, "g").ok());
  EXPECT_EQ(fs_->GetAttr(f).status().code(), ENOENT) << "the cache keeps no record the index deleted";
  ASSERT_TRUE(fs_->Rmdir(kRootInode, "d").ok());
  EXPECT_EQ(fs_->GetAttr(dir).status().code(), ENOENT);
  Reopen();
  same_as_index(kRootInode, "reopen");
}

// Readers that miss the cache read the index without the commit lock (GetAttr):
// one that read a record just before a commit replaced it must not put it
// back in the cache after the commit did, or every later GetAttr would answer
// the old mode until some other commit. The hook runs a chmod at exactly that
// moment of a GetAttr's miss.
TEST_F(FilesystemTest, RecordCacheKeepsNoRecordACommitReplaced) {
  InodeNumber f = MakeFile(kRootInode, "f");
  fs_->TEST_DropRecordCache();
  bool committed = false;
  fs_->TEST_AfterRecordMiss([&](InodeNumber ino) {
    if (ino != f || committed) return;
    committed = true;  // before: the chmod's own look-up comes here too
    SetAttrRequest chmod;
    chmod.mode = 0640;
    ASSERT_TRUE(fs_->SetAttr(f, chmod).ok());
  });
  auto during = fs_->GetAttr(f);  // read 0644, then the chmod commits 0640
  fs_->TEST_AfterRecordMiss(nullptr);
  ASSERT_TRUE(committed);
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during->attr.st_mode & 07777, 0644u) << "the GetAttr answers what it read";
  EXPECT_EQ(fs_->GetAttr(f)->attr.st_mode & 07777, 0640u) << "the next one answers the chmod's mode";
  EXPECT_EQ(index().GetInode(f)->mode & 07777, 0640u);

  // The same with an unlink that deletes the inode: no record may come back.
  fs_->TEST_DropRecordCache();
  bool deleted = false;
  fs_->TEST_AfterRecordMiss([&](InodeNumber ino) {
    if (ino != f || deleted) return;
    deleted = true;
    ASSERT_TRUE(fs_->Unlink(kRootInode, "f").ok());
  });
  (void)fs_->GetAttr(f);
  fs_->TEST_AfterRecordMiss(nullptr);
  ASSERT_TRUE(deleted);
  EXPECT_EQ(fs_->GetAttr(f).status().code(), ENOENT) << "a record the index deleted came back";
}

TEST_F(FilesystemTest, CreateLookupAndReadDir) {
  auto root = fs_->GetAttr(kRootInode);
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(S_ISDIR(root->attr.st_mode));
  EXPECT_EQ(root->attr.st_nlink, 2u);

  auto a = fs_->MakeNode(kRootInode, "a", S_IFREG | 0640, 0, Caller{1000, 100});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->attr.st_mode, static_cast<mode_t>(S_IFREG | 0640));
  EXPECT_EQ(a->attr.st_nlink, 1u);
  EXPECT_EQ(a->attr.st_uid, 1000u);
  EXPECT_EQ(a->attr.st_gid, 100u);
  EXPECT_EQ(a->attr.st_size, 0);
  InodeNumber d = MakeDir(kRootInode, "d");
  ASSERT_NE(d, 0u);
  auto b = fs_->MakeNode(d, "b", 0600, 0, caller_);  // no type bits: a regular file
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(S_ISREG(b->attr.st_mode));
  std::string long_name(Filesystem::kNameMax, 'n');
  InodeNumber longest = MakeFile(kRootInode, long_name);
  auto link = fs_->Symlink(kRootInode, "s", "d/b", caller_);
  ASSERT_TRUE(link.ok());

  EXPECT_NE(a->ino, d);
  EXPECT_NE(b->ino, a->ino);
  EXPECT_EQ(LookupIno(kRootInode, "a"), a->ino);
  EXPECT_EQ(LookupIno(kRootInode, "d"), d);
  EXPECT_EQ(LookupIno(d, "b"), b->ino);
  EXPECT_EQ(LookupIno(kRootInode, long_name), longest);
  EXPECT_EQ(LookupIno(d, ".."), kRootInode);
  EXPECT_EQ(LookupIno(d, "."), d);
  EXPECT_EQ(LookupIno(kRootInode, ".."), kRootInode);
  EXPECT_EQ(LookupErr(kRootInode, "b"), ENOENT);
  EXPECT_EQ(LookupErr(a->ino, "x"), ENOTDIR);
  EXPECT_EQ(LookupErr(kRootInode, long_name + "n"), ENAMETOOLONG);

  EXPECT_EQ(fs_->MakeNode(kRootInode, "a", S_IFREG | 0644, 0, caller_).status().code(), EEXIST);
  EXPECT_EQ(fs_->MakeDir(kRootInode, "d", 0755, caller_).status().code(), EEXIST);
  EXPECT_EQ(fs_->MakeNode(kRootInode, long_name + "n", S_IFREG | 0644, 0, caller_).status().code(), ENAMETOOLONG);
  EXPECT_EQ(fs_->MakeNode(a->ino, "x", S_IFREG | 0644, 0, caller_).status().code(), ENOTDIR);
  EXPECT_EQ(fs_->MakeNode(kRootInode, "", S_IFREG | 0644, 0, caller_).status().code(), ENOENT);

  auto target = fs_->ReadLink(link->ino);
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(*target, "d/b");
  EXPECT_EQ(fs_->ReadLink(a->ino).status().code(), EINVAL);

  auto hard = fs_->Link(a->ino, d, "a2");
  ASSERT_TRUE(hard.ok());
  EXPECT_EQ(hard->ino, a->ino);
  EXPECT_EQ(hard->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->Link(d, kRootInode, "dirlink").status().code(), EPERM);
  EXPECT_EQ(fs_->Link(a->ino, d, "b").status().code(), EEXIST);

  root = fs_->GetAttr(kRootInode);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->attr.st_nlink, 3u);  // ".", "..", and d's ".."

  auto check_listing = [&]() {
    auto entries = fs_->ReadDir(kRootInode);
    ASSERT_TRUE(entries.ok());
    ASSERT_EQ(entries->size(), 6u);
    EXPECT_EQ((*entries)[0].name, ".");
    EXPECT_EQ((*entries)[0].ino, kRootInode);
    EXPECT_EQ((*entries)[1].name, "..");
    std::map<std::string, std::pair<InodeNumber, uint32_t>> got;
    for (size_t i = 2; i < entries->size(); ++i) got[(*entries)[i].name] = {(*entries)[i].ino, (*entries)[i].type};
    std::map<std::string, std::pair<InodeNumber, uint32_t>> want = {
        {"a", {a->ino, S_IFREG}}, {"d", {d, S_IFDIR}}, {long_name, {longest, S_IFREG}}, {"s", {link->ino, S_IFLNK}}};
    EXPECT_EQ(got, want);
    auto sub = fs_->ReadDir(d);
    ASSERT_TRUE(sub.ok());
    ASSERT_EQ(sub->size(), 4u);
    EXPECT_EQ((*sub)[1].ino, kRootInode);
    EXPECT_EQ((*sub)[2].name, "a2");
    EXPECT_EQ((*sub)[3].name, "b");
  };
  check_listing();
  EXPECT_EQ(fs_->ReadDir(a->ino).status().code(), ENOTDIR);

  EXPECT_EQ(fs_->Rmdir(kRootInode, "d").code(), ENOTEMPTY);
  EXPECT_EQ(fs_->Unlink(kRootInode, "d").code(), EISDIR);
  EXPECT_EQ(fs_->Rmdir(kRootInode, "a").code(), ENOTDIR);
  EXPECT_EQ(fs_->Unlink(kRootInode, "missing").code(), ENOENT);

  // Everything is still there after the volume is closed and opened again.
  Reopen();
  check_listing();
  EXPECT_EQ(LookupIno(d, "b"), b->ino);
  EXPECT_EQ(*fs_->ReadLink(link->ino), "d/b");
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_uid, 1000u);

  // Remove it all again.
  ASSERT_TRUE(fs_->Unlink(d, "b").ok());
  ASSERT_TRUE(fs_->Unlink(d, "a2").ok());
  ASSERT_TRUE(fs_->Rmdir(kRootInode, "d").ok());
  EXPECT_EQ(fs_->GetAttr(d).status().code(), ENOENT);
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_nlink, 1u);
}

// ---- rename ----

TEST_F(FilesystemTest, RenameWithinAndAcrossDirectories) {
  InodeNumber d1 = MakeDir(kRootInode, "d1");
  InodeNumber f = MakeFile(kRootInode, "f");
  WriteAt(f, 0, "contents of f");
  ASSERT_NO_FATAL_FAILURE(ExpectRenamed(kRootInode, "f", kRootInode, "g", f));
  ASSERT_NO_FATAL_FAILURE(ExpectRenamed(kRootInode, "g", d1, "h", f));
  EXPECT_TRUE(SameBytes(ReadAll(f), "contents of f"));
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);

  // A directory moves with its ".." and its parents' link counts.
  InodeNumber sub = MakeDir(d1, "sub");
  InodeNumber inner = MakeFile(sub, "inner");
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 3u);
  ASSERT_TRUE(fs_->Rename(d1, "sub", kRootInode, "moved", 0).ok());
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 4u);  // d1 and moved
  EXPECT_EQ(LookupIno(sub, ".."), kRootInode);
  EXPECT_EQ(LookupIno(sub, "inner"), inner);
  EXPECT_EQ((*fs_->ReadDir(sub))[1].ino, kRootInode);

  // Errors change nothing.
  EXPECT_EQ(fs_->Rename(kRootInode, "nope", kRootInode, "x", 0).code(), ENOENT);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", f, "x", 0).code(), ENOTDIR);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", kRootInode, "x", RENAME_NOREPLACE | RENAME_EXCHANGE).code(), EINVAL);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", kRootInode, std::string(256, 'x'), 0).code(), ENAMETOOLONG);
  EXPECT_EQ(LookupIno(kRootInode, "moved"), sub);

  // Renaming onto itself, or onto another link of the same inode, does nothing.
  ASSERT_TRUE(fs_->Rename(d1, "h", d1, "h", 0).ok());
  EXPECT_EQ(LookupIno(d1, "h"), f);
  ASSERT_TRUE(fs_->Link(f, kRootInode, "h-link").ok());
  ASSERT_TRUE(fs_->Rename(d1, "h", kRootInode, "h-link", 0).ok());
  EXPECT_EQ(LookupIno(d1, "h"), f);
  EXPECT_EQ(LookupIno(kRootInode, "h-link"), f);
  EXPECT_EQ(fs_->GetAttr(f)->attr.st_nlink, 2u);
}

TEST_P(FilesystemDataTest, RenameOverAnExistingFileReplacesIt) {
  std::mt19937_64 rng(8);
  InodeNumber x = MakeFile(kRootInode, "x");
  InodeNumber y = MakeFile(kRootInode, "y");
  WriteAt(x, 0, "xxxx");
  WriteAt(y, 0, RandomBytes(rng, 1 << 20));
  EXPECT_EQ(FreeBlocks(), initial_free_ - 1 - 256);

  EXPECT_EQ(fs_->Rename(kRootInode, "x", kRootInode, "y", RENAME_NOREPLACE).code(), EEXIST);
  EXPECT_EQ(LookupIno(kRootInode, "x"), x);
  EXPECT_EQ(LookupIno(kRootInode, "y"), y);

  ASSERT_NO_FATAL_FAILURE(ExpectRenamed(kRootInode, "x", kRootInode, "y", x));
  EXPECT_TRUE(SameBytes(ReadAll(x), "xxxx"));
  EXPECT_EQ(fs_->GetAttr(y).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 1) << "the replaced file's blocks were not freed";
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(y)), 0u);

  ASSERT_TRUE(fs_->Rename(kRootInode, "y", kRootInode, "z", RENAME_NOREPLACE).ok());
  EXPECT_EQ(LookupIno(kRootInode, "z"), x);
  auto entries = fs_->ReadDir(kRootInode);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 3u);
}

TEST_F(FilesystemTest, RenameExchange) {
  InodeNumber d1 = MakeDir(kRootInode, "d1");
  InodeNumber d2 = MakeDir(kRootInode, "d2");
  InodeNumber f = MakeFile(d1, "f");
  WriteAt(f, 0, "file f");
  InodeNumber g = MakeDir(d2, "g");
  InodeNumber child = MakeFile(g, "child");
  ASSERT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);
  ASSERT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 3u);

  ASSERT_TRUE(fs_->Rename(d1, "f", d2, "g", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(d1, "f"), g);
  EXPECT_EQ(LookupIno(d2, "g"), f);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 3u) << "d1 gained a subdirectory";
  EXPECT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 2u) << "d2 lost a subdirectory";
  EXPECT_EQ(LookupIno(g, ".."), d1);
  EXPECT_EQ(LookupIno(g, "child"), child);
  EXPECT_TRUE(SameBytes(ReadAll(f), "file f"));
  auto listing = fs_->ReadDir(d1);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 3u);
  EXPECT_EQ((*listing)[2].name, "f");
  EXPECT_EQ((*listing)[2].type, static_cast<uint32_t>(S_IFDIR));
  listing = fs_->ReadDir(d2);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 3u);
  EXPECT_EQ((*listing)[2].type, static_cast<uint32_t>(S_IFREG));

  // Two files in one directory swap names.
  InodeNumber a = MakeFile(kRootInode, "a");
  InodeNumber b = MakeFile(kRootInode, "b");
  WriteAt(a, 0, "AAAA");
  WriteAt(b, 0, "BB");
  ASSERT_TRUE(fs_->Rename(kRootInode, "a", kRootInode, "b", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(kRootInode, "a"), b);
  EXPECT_EQ(LookupIno(kRootInode, "b"), a);
  EXPECT_TRUE(SameBytes(ReadAll(LookupIno(kRootInode, "a")), "BB"));
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 4u);

  // Exchange needs both names.
  EXPECT_EQ(fs_->Rename(kRootInode, "a", kRootInode, "missing", RENAME_EXCHANGE).code(), ENOENT);
  EXPECT_EQ(LookupIno(kRootInode, "a"), b);

  // Two directories in different parents swap, with their "..".
  InodeNumber e1 = MakeDir(d1, "e1");
  InodeNumber e2 = MakeDir(d2, "e2");
  ASSERT_TRUE(fs_->Rename(d1, "e1", d2, "e2", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(d1, "e1"), e2);
  EXPECT_EQ(LookupIno(d2, "e2"), e1);
  EXPECT_EQ(LookupIno(e1, ".."), d2);
  EXPECT_EQ(LookupIno(e2, ".."), d1);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 4u);
  EXPECT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 3u);

  Reopen();
  EXPECT_EQ(LookupIno(d1, "f"), g);
  EXPECT_EQ(LookupIno(g, ".."), d1);
  EXPECT_EQ(LookupIno(e1, ".."), d2);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 4u);
}

TEST_F(FilesystemTest, RenameReplacesAnEmptyDirectory) {
  InodeNumber p1 = MakeDir(kRootInode, "p1");
  InodeNumber p2 = MakeDir(kRootInode, "p2");
  InodeNumber src = MakeDir(p1, "src");
  InodeNumber inside = MakeFile(src, "inside");
  InodeNumber dst = MakeDir(p2, "dst");
  InodeNumber full = MakeDir(p2, "full");
  MakeFile(full, "keep");
  InodeNumber file = MakeFile(p2, "file");
  ASSERT_EQ(fs_->GetAttr(p1)->attr.st_nlink, 3u);
  ASSERT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);

  EXPECT_EQ(fs_->Rename(p1, "src", p2, "full", 0).code(), ENOTEMPTY);
  EXPECT_EQ(fs_->Rename(p1, "src", p2, "file", 0).code(), ENOTDIR);
  EXPECT_EQ(fs_->Rename(p2, "file", p2, "dst", 0).code(), EISDIR);
  EXPECT_EQ(LookupIno(p2, "full"), full);
  EXPECT_EQ(LookupIno(p2, "file"), file);

  ASSERT_NO_FATAL_FAILURE(ExpectRenamed(p1, "src", p2, "dst", src));
  EXPECT_EQ(LookupIno(src, ".."), p2);
  EXPECT_EQ(LookupIno(src, "inside"), inside);
  EXPECT_EQ(fs_->GetAttr(dst).status().code(), ENOENT) << "the replaced directory still exists";
  EXPECT_EQ(fs_->GetAttr(p1)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);  // lost dst, gained src

  // Within one directory.
  InodeNumber e = MakeDir(p2, "empty");
  ASSERT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 5u);
  ASSERT_TRUE(fs_->Rename(p2, "dst", p2, "empty", 0).ok());
  EXPECT_EQ(LookupIno(p2, "empty"), src);
  EXPECT_EQ(fs_->GetAttr(e).status().code(), ENOENT);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);

  Reopen();
  EXPECT_EQ(LookupIno(p2, "empty"), src);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);
  EXPECT_EQ(CountKeys(Family::kInode, keys::Ino(dst)), 0u);
  EXPECT_EQ(CountKeys(Family::kDirent, keys::Ino(dst)), 0u);
}

// ---- open-unlinked files and orphans ----

TEST_P(FilesystemDataTest, UnlinkedOpenFileKeepsItsDataUntilRelease) {
  std::mt19937_64 rng(10);
  InodeNumber ino = MakeFile(kRootInode, "open");
  std::string data = RandomBytes(rng, 1 << 20);
  WriteAt(ino, 0, data);
  const uint64_t with_file = FreeBlocks();
  EXPECT_EQ(with_file, initial_free_ - 256);

  ASSERT_TRUE(fs_->Open(ino).ok());
  ASSERT_TRUE(fs_->Open(ino).ok());  // two handles
  ASSERT_TRUE(fs_->Unlink(kRootInode, "open").ok());
  EXPECT_EQ(LookupErr(kRootInode, "open"), ENOENT);
  EXPECT_EQ(fs_->ReadDir(kRootInode)->size(), 2u);
  auto attr = fs_->GetAttr(ino);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->attr.st_nlink, 0u);
  EXPECT_TRUE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));
  EXPECT_EQ(FreeBlocks(), with_file) << "space of an open unlinked file was freed early";

  // It stays writable.
  WriteAt(ino, 1 << 20, "tail");
  EXPECT_TRUE(SameBytes(ReadAll(ino), data + "tail"));

  ASSERT_TRUE(fs_->Release(ino).ok());
  EXPECT_TRUE(fs_->GetAttr(ino).ok()) << "freed while a handle is still open";
  EXPECT_EQ(ReadAll(ino).size(), data.size() + 4);
  ASSERT_TRUE(fs_->Release(ino).ok());
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(ino)), 0u);
  ExpectSpaceAccountedFor();
}

TEST_P(FilesystemDataTest, UnlinkOfOneOfTwoLinksKeepsTheData) {
  InodeNumber ino = MakeFile(kRootInode, "one");
  WriteAt(ino, 0, "shared");
  ASSERT_TRUE(fs_->Link(ino, kRootInode, "two").ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "one").ok());
  EXPECT_EQ(fs_->GetAttr(ino)->attr.st_nlink, 1u);
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_TRUE(SameBytes(ReadAll(ino), "shared"));
  ASSERT_TRUE(fs_->Unlink(kRootInode, "two").ok());
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_P(FilesystemDataTest, OrphanIsReclaimedWhenTheVolumeIsOpenedAgain) {
  std::mt19937_64 rng(12);
  InodeNumber ino = MakeFile(kRootInode, "orphan");
  WriteAt(ino, 0, RandomBytes(rng, 512 << 10));
  InodeNumber keep = MakeFile(kRootInode, "keep");
  std::string kept = RandomBytes(rng, 10000);
  WriteAt(keep, 0, kept);
  ASSERT_TRUE(fs_->Open(ino).ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "orphan").ok());
  EXPECT_TRUE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_EQ(FreeBlocks(), initial_free_ - 128 - 3);

  // The daemon goes away without releasing the handle.
  Reopen();
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_FALSE(HasKey(Family::kInode, keys::Ino(ino)));
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(ino)), 0u);
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  EXPECT_TRUE(SameBytes(ReadAll(keep), kept));
  ExpectSpaceAccountedFor();

  // And the reclaimed space stays free across another open.
  Reopen();
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  EXPECT_EQ(CountKeys(Family::kOrphan), 0u);
}

}  // namespace
}  // namespace spillfs
