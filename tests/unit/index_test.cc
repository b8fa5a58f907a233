// Unit tests for kvindex/index.h: an Index in a temporary directory.
#include "spillfs/kvindex/index.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

std::string B(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

class IndexTest : public ::testing::Test {
 protected:
  std::string IndexPath() const { return dir_.path() + "/index"; }

  std::unique_ptr<Index> Create() {
    auto index = Index::Open(IndexPath(), Index::Options{.create = true});
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? std::move(index).value() : nullptr;
  }
  std::unique_ptr<Index> Reopen(bool read_only = false) {
    auto index = Index::Open(IndexPath(), Index::Options{.read_only = read_only});
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? std::move(index).value() : nullptr;
  }

  // The keys a cursor over `prefix` yields walking forward from its start.
  static std::vector<std::string> Forward(const Index& index, Family family, const std::string& prefix) {
    std::vector<std::string> out;
    auto cursor = index.NewCursor(family, prefix);
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) out.emplace_back(cursor->key());
    EXPECT_TRUE(cursor->status().ok());
    return out;
  }
  // The keys walking backward from the last key of the prefix.
  static std::vector<std::string> Backward(const Index& index, Family family, const std::string& prefix) {
    std::vector<std::string> out;
    auto cursor = index.NewCursor(family, prefix);
    for (cursor->SeekForPrev(prefix + std::string(64, '\xff')); cursor->Valid(); cursor->Prev()) {
      out.emplace_back(cursor->key());
    }
    return out;
  }

  void PutAll(Index* index, Family family, const std::vector<std::string>& keys) {
    Index::Batch batch(*index);
    for (const auto& k : keys) batch.Put(family, k, "v:" + k);
    ASSERT_TRUE(index->Commit(&batch).ok());
  }

  testing::TempDir dir_{"spillfs-index-test"};
};

TEST_F(IndexTest, CreateRefusesAnExistingIndex) {
  {
    auto index = Create();
    ASSERT_NE(index, nullptr);
  }
  auto again = Index::Open(IndexPath(), Index::Options{.create = true});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), EEXIST) << again.status().ToString();
  // The existing index is untouched and opens normally.
  EXPECT_NE(Reopen(), nullptr);
}

TEST_F(IndexTest, OpenRefusesAMissingIndex) {
  auto missing = Index::Open(IndexPath(), Index::Options{});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ENOENT);
  auto missing_ro = Index::Open(IndexPath(), Index::Options{.read_only = true});
  ASSERT_FALSE(missing_ro.ok());
  EXPECT_EQ(missing_ro.status().code(), ENOENT);
  // An empty directory is not an index either.
  ASSERT_EQ(mkdir(IndexPath().c_str(), 0755), 0);
  auto empty = Index::Open(IndexPath(), Index::Options{});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), ENOENT);
}

TEST_F(IndexTest, SecondWritableOpenIsRefused) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  auto second = Index::Open(IndexPath(), Index::Options{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
}

TEST_F(IndexTest, PutGetDeleteAndFamiliesAreSeparate) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  {
    Index::Batch batch(*index);
    for (int f = 0; f < static_cast<int>(Family::kCount); ++f) {
      batch.Put(static_cast<Family>(f), "key", std::string("value-") + FamilyName(static_cast<Family>(f)));
    }
    EXPECT_EQ(batch.Count(), static_cast<size_t>(Family::kCount));
    ASSERT_TRUE(index->Commit(&batch).ok());
  }
  for (int f = 0; f < static_cast<int>(Family::kCount); ++f) {
    std::string value;
    ASSERT_TRUE(index->Get(static_cast<Family>(f), "key", &value).ok());
    EXPECT_EQ(value, std::string("value-") + FamilyName(static_cast<Family>(f)));
  }
  {
    Index::Batch batch(*index);
    batch.Delete(Family::kExtent, "key");
    ASSERT_TRUE(index->Commit(&batch).ok());
  }
  std::string value;
  Status s = index->Get(Family::kExtent, "key", &value);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_EQ(s.code(), ENOENT);
  EXPECT_TRUE(index->Get(Family::kInode, "key", &value).ok());
  EXPECT_TRUE(index->Get(Family::kInode, "other", &value).IsNotFound());
}

// Keys looked up together: each value at its key's place, absent keys (and a
// key of another family) nullopt, keys from the memtable and from files alike.
TEST_F(IndexTest, MultiGetFindsEachKeyInPlace) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  std::vector<std::string> keys;
  for (int i = 0; i < 2000; ++i) keys.push_back(fmt::format("k{:05}", (i * 7919) % 2000));
  auto put = [&](int from, int to, Family family) {
    Index::Batch batch(*index);
    for (int i = from; i < to; ++i) batch.Put(family, keys[i], "v" + keys[i]);
    ASSERT_TRUE(index->Commit(&batch).ok());
  };
  put(0, 1000, Family::kBlob);
  index.reset();  // the first half to files (the reopen's recovery writes them), the rest in the memtable
  index = Reopen();
  ASSERT_NE(index, nullptr);
  put(1000, 1500, Family::kBlob);
  put(1500, 1600, Family::kExtent);
  std::vector<std::optional<std::string>> values;
  ASSERT_TRUE(index->MultiGet(Family::kBlob, keys, &values).ok());
  ASSERT_EQ(values.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < 1500) {
      ASSERT_TRUE(values[i].has_value()) << keys[i];
      EXPECT_EQ(*values[i], "v" + keys[i]);
    } else {
      EXPECT_FALSE(values[i].has_value()) << keys[i];
    }
  }
  ASSERT_TRUE(index->MultiGet(Family::kBlob, {}, &values).ok());
  EXPECT_TRUE(values.empty());
}

TEST_F(IndexTest, FamilyNames) {
  EXPECT_STREQ(FamilyName(Family::kInode), "inode");
  EXPECT_STREQ(FamilyName(Family::kDirent), "dirent");
  EXPECT_STREQ(FamilyName(Family::kExtent), "extent");
  EXPECT_STREQ(FamilyName(Family::kFree), "free");
  EXPECT_STREQ(FamilyName(Family::kOrphan), "orphan");
  EXPECT_STREQ(FamilyName(Family::kXattr), "xattr");
  EXPECT_STREQ(FamilyName(Family::kBlob), "blob");
  EXPECT_STREQ(FamilyName(Family::kMeta), "meta");
}

TEST_F(IndexTest, BatchIsAllOrNothing) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  PutAll(index.get(), Family::kMeta, {"a", "b"});
  {
    // A batch dropped without a commit changes nothing.
    Index::Batch batch(*index);
    batch.Put(Family::kMeta, "c", "1");
    batch.Delete(Family::kMeta, "a");
    EXPECT_EQ(batch.Count(), 2u);
  }
  std::string value;
  EXPECT_TRUE(index->Get(Family::kMeta, "a", &value).ok());
  EXPECT_TRUE(index->Get(Family::kMeta, "c", &value).IsNotFound());

  // Puts and deletes across families, applied in order within the batch.
  Index::Batch batch(*index);
  batch.Put(Family::kMeta, "c", "1");
  batch.Delete(Family::kMeta, "a");
  batch.Put(Family::kInode, keys::Ino(5), "inode5");
  batch.Put(Family::kMeta, "d", "first");
  batch.Put(Family::kMeta, "d", "second");
  batch.Put(Family::kMeta, "e", "gone");
  batch.Delete(Family::kMeta, "e");
  ASSERT_TRUE(index->Commit(&batch, /*sync=*/true).ok());
  EXPECT_TRUE(index->Get(Family::kMeta, "a", &value).IsNotFound());
  EXPECT_TRUE(index->Get(Family::kMeta, "c", &value).ok());
  ASSERT_TRUE(index->Get(Family::kMeta, "d", &value).ok());
  EXPECT_EQ(value, "second");
  EXPECT_TRUE(index->Get(Family::kMeta, "e", &value).IsNotFound());
  EXPECT_TRUE(index->Get(Family::kInode, keys::Ino(5), &value).ok());
  EXPECT_TRUE(index->Sync().ok());

  // Everything committed survives a reopen.
  index.reset();
  index = Reopen();
  ASSERT_NE(index, nullptr);
  EXPECT_TRUE(index->Get(Family::kMeta, "a", &value).IsNotFound());
  ASSERT_TRUE(index->Get(Family::kMeta, "b", &value).ok());
  EXPECT_EQ(value, "v:b");
  ASSERT_TRUE(index->Get(Family::kMeta, "d", &value).ok());
  EXPECT_EQ(value, "second");
  ASSERT_TRUE(index->Get(Family::kInode, keys::Ino(5), &value).ok());
  EXPECT_EQ(value, "inode5");
}

// A reader never sees part of a batch: every batch rewrites ten keys with the
// same generation, and every scan must see ten equal values.
TEST_F(IndexTest, ConcurrentReadersNeverSeeHalfABatch) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  const std::string prefix = keys::Ino(77);
  auto write_generation = [&](uint64_t gen) {
    Index::Batch batch(*index);
    for (uint64_t k = 0; k < 10; ++k) batch.Put(Family::kExtent, keys::Extent(77, k), EncodeMetaU64(gen));
    // Also move a marker key: the old one is deleted, a new one added.
    if (gen > 0) batch.Delete(Family::kExtent, keys::Extent(77, 1000 + gen - 1));
    batch.Put(Family::kExtent, keys::Extent(77, 1000 + gen), EncodeMetaU64(gen));
    return index->Commit(&batch);
  };
  ASSERT_TRUE(write_generation(0).ok());
  std::atomic<bool> done{false};
  std::atomic<int> torn{0}, scans{0};
  std::thread reader([&] {
    while (!done.load()) {
      auto cursor = index->NewCursor(Family::kExtent, prefix);
      std::vector<uint64_t> gens;
      for (cursor->Seek(prefix); cursor->Valid(); cursor->Next()) {
        gens.push_back(coding::DecodeFixed64BE(cursor->value().data()));
      }
      if (gens.size() != 11) ++torn;
      for (uint64_t g : gens) {
        if (g != gens[0]) ++torn;
      }
      ++scans;
    }
  });
  for (uint64_t gen = 1; gen <= 2000; ++gen) ASSERT_TRUE(write_generation(gen).ok());
  while (scans.load() < 50) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GE(scans.load(), 50);
}

TEST_F(IndexTest, CursorStaysInsideAPrefixEndingInFF) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  const std::vector<std::string> all = {B({0x01, 0xfe}),
                                        B({0x01, 0xfe, 0xff}),
                                        B({0x01, 0xff}),
                                        B({0x01, 0xff, 0x00}),
                                        B({0x01, 0xff, 0x7f}),
                                        B({0x01, 0xff, 0xff}),
                                        B({0x01, 0xff, 0xff, 0xff}),
                                        B({0x02}),
                                        B({0x02, 0x00}),
                                        B({0xff}),
                                        B({0xff, 0xfe}),
                                        B({0xff, 0xff}),
                                        B({0xff, 0xff, 0x00}),
                                        B({0xff, 0xff, 0xff, 0xff})};
  PutAll(index.get(), Family::kDirent, all);

  const std::vector<std::string> in_01ff = {B({0x01, 0xff}), B({0x01, 0xff, 0x00}), B({0x01, 0xff, 0x7f}),
                                            B({0x01, 0xff, 0xff}), B({0x01, 0xff, 0xff, 0xff})};
  EXPECT_EQ(Forward(*index, Family::kDirent, B({0x01, 0xff})), in_01ff);
  EXPECT_EQ(Backward(*index, Family::kDirent, B({0x01, 0xff})),
            std::vector<std::string>(in_01ff.rbegin(), in_01ff.rend()));

  // A prefix of only 0xff bytes has no successor: the cursor must still stop at its end.
  const std::vector<std::string> in_ffff = {B({0xff, 0xff}), B({0xff, 0xff, 0x00}), B({0xff, 0xff, 0xff, 0xff})};
  EXPECT_EQ(Forward(*index, Family::kDirent, B({0xff, 0xff})), in_ffff);
  EXPECT_EQ(Backward(*index, Family::kDirent, B({0xff, 0xff})),
            std::vector<std::string>(in_ffff.rbegin(), in_ffff.rend()));
  const std::vector<std::string> in_ff = {B({0xff}), B({0xff, 0xfe}), B({0xff, 0xff}), B({0xff, 0xff, 0x00}),
                                          B({0xff, 0xff, 0xff, 0xff})};
  EXPECT_EQ(Forward(*index, Family::kDirent, B({0xff})), in_ff);

  // Other prefixes and the empty prefix.
  EXPECT_EQ(Forward(*index, Family::kDirent, B({0x01})).size(), 7u);
  EXPECT_EQ(Forward(*index, Family::kDirent, B({0x02})), (std::vector<std::string>{B({0x02}), B({0x02, 0x00})}));
  EXPECT_EQ(Forward(*index, Family::kDirent, ""), all);
  EXPECT_TRUE(Forward(*index, Family::kDirent, B({0x03})).empty());
  EXPECT_TRUE(Forward(*index, Family::kDirent, B({0x01, 0xff, 0xff, 0xff, 0xff})).empty());
  // Other families are not visible.
  EXPECT_TRUE(Forward(*index, Family::kInode, "").empty());

  // Values come with their keys.
  auto cursor = index->NewCursor(Family::kDirent, B({0x01, 0xff}));
  cursor->Seek("");
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(cursor->value(), "v:" + B({0x01, 0xff}));
}

TEST_F(IndexTest, SeekAndSeekForPrevInsideAPrefix) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  // Extent maps of inodes 4, 5 and 6; the cursor is over inode 5.
  std::vector<std::string> all;
  for (uint64_t ino : {4, 5, 6}) {
    for (uint64_t off : {0, 4096, 65536, 1 << 20}) all.push_back(keys::Extent(ino, off));
  }
  PutAll(index.get(), Family::kExtent, all);
  auto cursor = index->NewCursor(Family::kExtent, keys::Ino(5));
  auto offset_at = [&]() { return keys::ExtentOffset(cursor->key()); };

  // Seek.
  cursor->Seek(keys::Extent(5, 5000));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(keys::DecodeIno(cursor->key()), 5u);
  EXPECT_EQ(offset_at(), 65536u);
  cursor->Seek(keys::Extent(5, 4096));  // exact hit
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), 4096u);
  cursor->Seek(keys::Extent(4, 99));  // below the prefix: the prefix's first key
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(keys::DecodeIno(cursor->key()), 5u);
  EXPECT_EQ(offset_at(), 0u);
  cursor->Seek("");
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(keys::DecodeIno(cursor->key()), 5u);
  cursor->Seek(keys::Extent(5, (1 << 20) + 1));  // past the last key of inode 5
  EXPECT_FALSE(cursor->Valid());
  cursor->Seek(keys::Extent(6, 0));
  EXPECT_FALSE(cursor->Valid());

  // SeekForPrev.
  cursor->SeekForPrev(keys::Extent(5, 5000));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), 4096u);
  cursor->SeekForPrev(keys::Extent(5, 65536));  // exact hit
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), 65536u);
  cursor->SeekForPrev(keys::Extent(5, UINT64_MAX));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), uint64_t{1} << 20);
  cursor->SeekForPrev(keys::Extent(6, 4096));  // beyond the prefix: its last key, not inode 6's
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(keys::DecodeIno(cursor->key()), 5u);
  EXPECT_EQ(offset_at(), uint64_t{1} << 20);
  cursor->SeekForPrev(keys::Ino(5));  // before the first key of inode 5: inode 4 is outside
  EXPECT_FALSE(cursor->Valid());
  cursor->SeekForPrev(keys::Extent(4, UINT64_MAX));
  EXPECT_FALSE(cursor->Valid());

  // Next and Prev stop at the prefix edges.
  cursor->Seek(keys::Extent(5, 0));
  ASSERT_TRUE(cursor->Valid());
  cursor->Prev();
  EXPECT_FALSE(cursor->Valid());
  cursor->SeekForPrev(keys::Extent(5, UINT64_MAX));
  ASSERT_TRUE(cursor->Valid());
  cursor->Next();
  EXPECT_FALSE(cursor->Valid());
  cursor->SeekForPrev(keys::Extent(5, 65536));
  cursor->Prev();
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), 4096u);
  cursor->Next();
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(offset_at(), 65536u);
  EXPECT_TRUE(cursor->status().ok());
}

TEST_F(IndexTest, SeekForPrevInsideAnFFPrefix) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  PutAll(index.get(), Family::kXattr,
         {B({0xff, 0x01}), B({0xff, 0xff, 0x01}), B({0xff, 0xff, 0x80}), B({0xff, 0xff, 0xff})});
  auto cursor = index->NewCursor(Family::kXattr, B({0xff, 0xff}));
  cursor->SeekForPrev(B({0xff, 0xff, 0x7f}));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(cursor->key(), B({0xff, 0xff, 0x01}));
  cursor->SeekForPrev(B({0xff, 0xff, 0x00}));
  EXPECT_FALSE(cursor->Valid());  // only 0xff 0x01 lies below, outside the prefix
  cursor->SeekForPrev(B({0xff, 0xff, 0xff, 0xff, 0xff}));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(cursor->key(), B({0xff, 0xff, 0xff}));
  cursor->Seek(B({0xff, 0xff, 0x02}));
  ASSERT_TRUE(cursor->Valid());
  EXPECT_EQ(cursor->key(), B({0xff, 0xff, 0x80}));
}

TEST_F(IndexTest, ReadOnlyOpenReadsButCannotCommit) {
  {
    auto index = Create();
    ASSERT_NE(index, nullptr);
    Index::Batch batch(*index);
    batch.Put(Family::kMeta, "k", "v");
    batch.Put(Family::kInode, keys::Ino(3), "three");
    ASSERT_TRUE(index->Commit(&batch, /*sync=*/true).ok());
  }
  auto index = Reopen(/*read_only=*/true);
  ASSERT_NE(index, nullptr);
  std::string value;
  ASSERT_TRUE(index->Get(Family::kMeta, "k", &value).ok());
  EXPECT_EQ(value, "v");
  EXPECT_EQ(Forward(*index, Family::kInode, "").size(), 1u);

  Index::Batch batch(*index);
  batch.Put(Family::kMeta, "k", "changed");
  batch.Put(Family::kMeta, "new", "x");
  Status s = index->Commit(&batch);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), EROFS) << s.ToString();
  ASSERT_TRUE(index->Get(Family::kMeta, "k", &value).ok());
  EXPECT_EQ(value, "v");
  EXPECT_TRUE(index->Get(Family::kMeta, "new", &value).IsNotFound());
  index.reset();

  // Nothing of the refused batch reached the disk.
  auto writable = Reopen();
  ASSERT_NE(writable, nullptr);
  ASSERT_TRUE(writable->Get(Family::kMeta, "k", &value).ok());
  EXPECT_EQ(value, "v");
  EXPECT_TRUE(writable->Get(Family::kMeta, "new", &value).IsNotFound());
}

TEST_F(IndexTest, TypedHelpers) {
  auto index = Create();
  ASSERT_NE(index, nullptr);
  InodeRecord inode;
  inode.mode = S_IFREG | 0600;
  inode.nlink = 1;
  inode.size = 12345;
  DirentRecord dirent{42, S_IFREG};
  Superblock sb;
  sb.uuid = std::string(16, '\x01');
  sb.data_offset = 1 << 20;
  sb.data_size = 16 << 20;

  EXPECT_EQ(index->GetSuperblock().status().code(), EUCLEAN);  // none yet
  EXPECT_TRUE(index->GetInode(42).status().IsNotFound());
  EXPECT_TRUE(index->GetDirent(kRootInode, "f").status().IsNotFound());
  EXPECT_TRUE(index->GetMetaU64(keys::kNextIno).status().IsNotFound());

  Index::Batch batch(*index);
  batch.Put(Family::kInode, keys::Ino(42), inode.Encode());
  batch.Put(Family::kDirent, keys::Dirent(kRootInode, "f"), dirent.Encode());
  batch.Put(Family::kMeta, keys::kSuperblock, sb.Encode());
  batch.Put(Family::kMeta, keys::kNextIno, EncodeMetaU64(UINT64_MAX - 3));
  batch.Put(Family::kMeta, "short", "1234567");
  batch.Put(Family::kInode, keys::Ino(43), "\x09garbage");
  ASSERT_TRUE(index->Commit(&batch).ok());

  auto got_inode = index->GetInode(42);
  ASSERT_TRUE(got_inode.ok());
  EXPECT_EQ(*got_inode, inode);
  auto got_dirent = index->GetDirent(kRootInode, "f");
  ASSERT_TRUE(got_dirent.ok());
  EXPECT_EQ(*got_dirent, dirent);
  auto got_sb = index->GetSuperblock();
  ASSERT_TRUE(got_sb.ok());
  EXPECT_EQ(*got_sb, sb);
  auto next = index->GetMetaU64(keys::kNextIno);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, UINT64_MAX - 3);
  EXPECT_EQ(index->GetMetaU64("short").status().code(), EUCLEAN);
  EXPECT_EQ(index->GetInode(43).status().code(), EUCLEAN);
  EXPECT_EQ(EncodeMetaU64(0x0102030405060708ull), B({1, 2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace spillfs
