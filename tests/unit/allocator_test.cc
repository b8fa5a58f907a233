// Unit tests for fs/allocator.h against a real Index in a temporary directory.
#include "spillfs/store/allocator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::TempDir;

constexpr uint64_t kUnit = 4096;
constexpr uint64_t kBase = 1 << 20;        // first allocatable byte
constexpr uint64_t kTotal = 1024 * kUnit;  // 4 MiB of allocatable space

uint64_t Sum(const std::vector<PhysicalExtent>& extents) {
  uint64_t total = 0;
  for (const auto& e : extents) total += e.length;
  return total;
}

bool Overlap(const PhysicalExtent& a, const PhysicalExtent& b) {
  return a.offset < b.offset + b.length && b.offset < a.offset + a.length;
}

class AllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto index = Index::Open(dir_.path() + "/index", Index::Options{.create = true});
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    index_ = std::move(index).value();
    SetFree({{kBase, kTotal}});
    ASSERT_TRUE(alloc_.Load(*index_).ok());
  }

  // Replaces the free family with `extents`.
  void SetFree(const std::map<uint64_t, uint64_t>& extents) {
    Index::Batch batch(*index_);
    auto cursor = index_->NewCursor(Family::kFree, "");
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) batch.Delete(Family::kFree, cursor->key());
    for (auto [offset, length] : extents) {
      std::string value;
      coding::PutVarint64(&value, length);
      batch.Put(Family::kFree, keys::Free(offset), value);
    }
    ASSERT_TRUE(index_->Commit(&batch).ok());
  }

  // The free family as stored in the index.
  std::map<uint64_t, uint64_t> StoredFree() {
    std::map<uint64_t, uint64_t> out;
    auto cursor = index_->NewCursor(Family::kFree, "");
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
      coding::Reader reader(cursor->value());
      uint64_t length = 0;
      EXPECT_TRUE(reader.GetVarint64(&length));
      out[keys::DecodeIno(cursor->key())] = length;
    }
    return out;
  }

  // Commits `allocated` as mapped and `freed` as free in one batch.
  void Commit(const std::vector<PhysicalExtent>& allocated, const std::vector<PhysicalExtent>& freed) {
    Index::Batch batch(*index_);
    if (!allocated.empty()) alloc_.CommitAllocated(allocated, &batch);
    if (!freed.empty()) alloc_.CommitFreed(freed, &batch);
    ASSERT_TRUE(index_->Commit(&batch).ok());
    ExpectReloadMatches();
  }

  // Reserves LENGTH bytes and commits them as allocated; the extents go to
  // *SPACE where it is given.
  void ReserveAndCommit(uint64_t length, std::vector<PhysicalExtent>* space = nullptr) {
    auto r = alloc_.Reserve(length);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Commit(*r, {});
    if (space != nullptr) *space = *r;
  }

  // A fresh Allocator loaded from the index sees exactly the persisted view.
  void ExpectReloadMatches() {
    Allocator fresh(kUnit);
    ASSERT_TRUE(fresh.Load(*index_).ok());
    EXPECT_EQ(fresh.persisted(), alloc_.persisted());
    EXPECT_EQ(fresh.persisted_free_bytes(), alloc_.persisted_free_bytes());
    EXPECT_EQ(fresh.available_bytes(), fresh.persisted_free_bytes());
    EXPECT_EQ(StoredFree(), alloc_.persisted());
    ExpectCoalesced(alloc_.persisted());
  }

  static void ExpectCoalesced(const std::map<uint64_t, uint64_t>& map) {
    uint64_t prev_end = 0;
    bool first = true;
    for (auto [offset, length] : map) {
      EXPECT_GT(length, 0u);
      EXPECT_EQ(offset % kUnit, 0u);
      EXPECT_EQ(length % kUnit, 0u);
      EXPECT_GE(offset, kBase);
      EXPECT_LE(offset + length, kBase + kTotal);
      if (!first) {
        EXPECT_GT(offset, prev_end) << "free extents touch or overlap at " << offset;
      }
      prev_end = offset + length;
      first = false;
    }
  }

  TempDir dir_{"spillfs-alloc-test"};
  std::unique_ptr<Index> index_;
  Allocator alloc_{kUnit};
};

TEST_F(AllocatorTest, LoadSeesTheWholeArea) {
  EXPECT_EQ(alloc_.available_bytes(), kTotal);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal);
  EXPECT_EQ(alloc_.persisted(), (std::map<uint64_t, uint64_t>{{kBase, kTotal}}));
}

TEST_F(AllocatorTest, ReserveCommitFreeReleaseCycle) {
  auto a = alloc_.Reserve(4 * kUnit);
  ASSERT_TRUE(a.ok());
  auto b = alloc_.Reserve(8 * kUnit);
  ASSERT_TRUE(b.ok());
  auto c = alloc_.Reserve(2 * kUnit);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Sum(*a), 4 * kUnit);
  EXPECT_EQ(Sum(*b), 8 * kUnit);
  EXPECT_EQ(Sum(*c), 2 * kUnit);
  for (const auto& x : *a) {
    for (const auto& y : *b) EXPECT_FALSE(Overlap(x, y));
    for (const auto& y : *c) EXPECT_FALSE(Overlap(x, y));
  }
  for (const auto& x : *b) {
    for (const auto& y : *c) EXPECT_FALSE(Overlap(x, y));
  }
  // Reserved space is unavailable, but still persisted as free.
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 14 * kUnit);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal);

  std::vector<PhysicalExtent> all = *a;
  all.insert(all.end(), b->begin(), b->end());
  all.insert(all.end(), c->begin(), c->end());
  Commit(all, {});
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal - 14 * kUnit);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 14 * kUnit);

  // Free the middle allocation: persisted at once, available only after Release.
  Commit({}, *b);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal - 6 * kUnit);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 14 * kUnit);
  alloc_.Release(*b);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 6 * kUnit);

  // Free the rest: the free list coalesces back into one extent.
  std::vector<PhysicalExtent> rest = *a;
  rest.insert(rest.end(), c->begin(), c->end());
  Commit({}, rest);
  alloc_.Release(rest);
  EXPECT_EQ(alloc_.persisted(), (std::map<uint64_t, uint64_t>{{kBase, kTotal}}));
  EXPECT_EQ(alloc_.available_bytes(), kTotal);
  EXPECT_EQ(StoredFree(), (std::map<uint64_t, uint64_t>{{kBase, kTotal}}));
}

TEST_F(AllocatorTest, SpaceFreedInTheSameBatchAsAnAllocation) {
  std::vector<PhysicalExtent> old_space;
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(6 * kUnit, &old_space));
  // An overwrite: new space mapped and the old freed in one batch.
  auto new_space = alloc_.Reserve(6 * kUnit);
  ASSERT_TRUE(new_space.ok());
  for (const auto& x : *new_space) {
    for (const auto& y : old_space) EXPECT_FALSE(Overlap(x, y));
  }
  Commit(*new_space, old_space);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal - 6 * kUnit);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 12 * kUnit);
  alloc_.Release(old_space);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 6 * kUnit);
}

TEST_F(AllocatorTest, InvalidLengthsAreRefused) {
  for (uint64_t length : {uint64_t{0}, uint64_t{1}, kUnit - 1, kUnit + 1, 3 * kUnit / 2}) {
    auto r = alloc_.Reserve(length);
    ASSERT_FALSE(r.ok()) << length;
    EXPECT_EQ(r.status().code(), EINVAL) << length;
  }
  EXPECT_EQ(alloc_.available_bytes(), kTotal);
}

TEST_F(AllocatorTest, NoSpaceWhenFull) {
  auto too_big = alloc_.Reserve(kTotal + kUnit);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), ENOSPC);
  EXPECT_EQ(alloc_.available_bytes(), kTotal);

  auto all = alloc_.Reserve(kTotal);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Sum(*all), kTotal);
  EXPECT_EQ(alloc_.available_bytes(), 0u);
  auto one = alloc_.Reserve(kUnit);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), ENOSPC);

  Commit(*all, {});
  EXPECT_EQ(alloc_.persisted_free_bytes(), 0u);
  EXPECT_TRUE(alloc_.persisted().empty());
  EXPECT_TRUE(StoredFree().empty());
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);

  // Freeing one block makes exactly one block available again.
  PhysicalExtent block{(*all)[0].offset, kUnit};
  Commit({}, {block});
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);  // not yet released
  alloc_.Release({block});
  auto again = alloc_.Reserve(kUnit);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, std::vector<PhysicalExtent>{block});
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
}

TEST_F(AllocatorTest, FragmentedSpaceIsReturnedAsSeveralExtents) {
  // Map every block, then free every other one.
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(kTotal));
  std::vector<PhysicalExtent> holes;
  for (uint64_t off = kBase; off < kBase + kTotal; off += 2 * kUnit) holes.push_back({off, kUnit});
  Commit({}, holes);
  alloc_.Release(holes);
  EXPECT_EQ(alloc_.persisted().size(), holes.size());
  EXPECT_EQ(alloc_.available_bytes(), kTotal / 2);

  auto three = alloc_.Reserve(3 * kUnit);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_GE(three->size(), 3u);
  EXPECT_EQ(Sum(*three), 3 * kUnit);
  for (size_t i = 0; i < three->size(); ++i) {
    const auto& e = (*three)[i];
    EXPECT_EQ(e.offset % (2 * kUnit), kBase % (2 * kUnit)) << "extent outside the holes";
    EXPECT_EQ(e.length, kUnit);
    for (size_t j = i + 1; j < three->size(); ++j) EXPECT_FALSE(Overlap(e, (*three)[j]));
  }
  Commit(*three, {});
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal / 2 - 3 * kUnit);

  // Asking for all that is left still works, in as many pieces as needed.
  auto rest = alloc_.Reserve(kTotal / 2 - 3 * kUnit);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(Sum(*rest), kTotal / 2 - 3 * kUnit);
  EXPECT_EQ(rest->size(), holes.size() - 3);
  Commit(*rest, {});
  EXPECT_TRUE(alloc_.persisted().empty());
}

TEST_F(AllocatorTest, MixedRunLengthsSumUp) {
  // Free runs of 1, 2 and 3 blocks separated by mapped blocks: a request of
  // 5 blocks fits none and must be served from several runs.
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(kTotal));
  std::vector<PhysicalExtent> runs = {
      {kBase + 10 * kUnit, 1 * kUnit}, {kBase + 20 * kUnit, 2 * kUnit}, {kBase + 30 * kUnit, 3 * kUnit}};
  Commit({}, runs);
  alloc_.Release(runs);
  auto five = alloc_.Reserve(5 * kUnit);
  ASSERT_TRUE(five.ok());
  EXPECT_GE(five->size(), 2u);
  EXPECT_EQ(Sum(*five), 5 * kUnit);
  for (const auto& e : *five) {
    bool inside = false;
    for (const auto& r : runs) inside |= e.offset >= r.offset && e.offset + e.length <= r.offset + r.length;
    EXPECT_TRUE(inside) << e.offset;
  }
  EXPECT_EQ(alloc_.available_bytes(), kUnit);
  EXPECT_EQ(alloc_.Reserve(2 * kUnit).status().code(), ENOSPC);
}

TEST_F(AllocatorTest, ReservedButUncommittedSpaceIsFreeAfterReload) {
  std::vector<PhysicalExtent> committed;
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(16 * kUnit, &committed));
  auto reserved = alloc_.Reserve(100 * kUnit);
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 116 * kUnit);

  // A crash now: a fresh allocator only knows the index.
  Allocator fresh(kUnit);
  ASSERT_TRUE(fresh.Load(*index_).ok());
  EXPECT_EQ(fresh.available_bytes(), kTotal - 16 * kUnit);
  EXPECT_EQ(fresh.persisted_free_bytes(), kTotal - 16 * kUnit);
  // The reserved range can be handed out again by the fresh allocator.
  auto everything = fresh.Reserve(kTotal - 16 * kUnit);
  ASSERT_TRUE(everything.ok());
  for (const auto& e : *everything) {
    for (const auto& c : committed) EXPECT_FALSE(Overlap(e, c));
  }

  // Loading again into the same allocator also drops the reservation.
  ASSERT_TRUE(alloc_.Load(*index_).ok());
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 16 * kUnit);
}

TEST_F(AllocatorTest, UnreserveMakesSpaceAvailableAgain) {
  auto r = alloc_.Reserve(kTotal);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(alloc_.available_bytes(), 0u);
  alloc_.Unreserve(*r);
  EXPECT_EQ(alloc_.available_bytes(), kTotal);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal);
  auto again = alloc_.Reserve(kTotal);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Sum(*again), kTotal);
}

// Delayed allocation: space promised by Hold() cannot be reserved by anyone
// else, a Reserve() can draw on its own hold, and ReleaseHold() gives it back.
TEST_F(AllocatorTest, HoldsPromiseSpace) {
  ASSERT_TRUE(alloc_.Hold(10 * kUnit).ok());
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 10 * kUnit);
  EXPECT_EQ(alloc_.persisted_free_bytes(), kTotal);
  EXPECT_EQ(alloc_.Hold(kTotal).code(), ENOSPC);
  EXPECT_EQ(alloc_.available_bytes(), kTotal - 10 * kUnit) << "a refused hold changed the books";

  // Other reservations may not eat into the held space.
  EXPECT_EQ(alloc_.Reserve(kTotal - 9 * kUnit).status().code(), ENOSPC);
  auto others = alloc_.Reserve(kTotal - 10 * kUnit);
  ASSERT_TRUE(others.ok());
  EXPECT_EQ(alloc_.available_bytes(), 0u);
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
  EXPECT_EQ(alloc_.Hold(kUnit).code(), ENOSPC);

  // The holder converts part of its hold into a reservation.
  auto mine = alloc_.Reserve(4 * kUnit, /*from_hold=*/4 * kUnit);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(Sum(*mine), 4 * kUnit);
  for (const auto& x : *mine) {
    for (const auto& y : *others) EXPECT_FALSE(Overlap(x, y));
  }
  EXPECT_EQ(alloc_.available_bytes(), 0u);  // 6 units left, all still held
  alloc_.ReleaseHold(6 * kUnit);
  EXPECT_EQ(alloc_.available_bytes(), 6 * kUnit);
  alloc_.ReleaseHold(kUnit);  // more than is held: nothing changes
  EXPECT_EQ(alloc_.available_bytes(), 6 * kUnit);

  // Holds live in memory only: the index knows nothing of them.
  std::vector<PhysicalExtent> all = *others;
  all.insert(all.end(), mine->begin(), mine->end());
  Commit(all, {});
  EXPECT_EQ(alloc_.persisted_free_bytes(), 6 * kUnit);
  ASSERT_TRUE(alloc_.Hold(6 * kUnit).ok());
  Allocator fresh(kUnit);
  ASSERT_TRUE(fresh.Load(*index_).ok());
  EXPECT_EQ(fresh.available_bytes(), 6 * kUnit);
}

// Space freed by a batch that is not yet durable is parked: a power cut
// could bring the old mapping back, so it must not be reused before Durable()
// reaches that batch. It still counts as free.
TEST_F(AllocatorTest, FreedSpaceIsNotReusedBeforeItsBatchIsDurable) {
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(kTotal));
  const PhysicalExtent first{kBase + 8 * kUnit, 2 * kUnit};
  const PhysicalExtent second{kBase + 100 * kUnit, kUnit};
  Commit({}, {first});
  const uint64_t first_commit = index_->last_commit();
  Commit({}, {second});
  const uint64_t second_commit = index_->last_commit();
  ASSERT_LT(first_commit, second_commit);
  alloc_.Release({first}, first_commit);
  alloc_.Release({second}, second_commit);
  EXPECT_EQ(alloc_.parked_bytes(), 3 * kUnit);
  EXPECT_GT(alloc_.parked_for().count(), 0) << "the filesystem syncs when this grows too old";
  EXPECT_EQ(alloc_.available_bytes(), 3 * kUnit) << "parked space counts as free";
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC) << "parked space was handed out";

  alloc_.Durable(first_commit - 1);
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
  alloc_.Durable(first_commit);  // the first batch only
  EXPECT_EQ(alloc_.parked_bytes(), kUnit);
  auto again = alloc_.Reserve(2 * kUnit);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, std::vector<PhysicalExtent>{first});
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
  Commit(*again, {});

  // An Index sync reports the batches it made durable.
  index_->SetDurableListener([this](uint64_t commit) { alloc_.Durable(commit); });
  ASSERT_TRUE(index_->Sync().ok());
  index_->SetDurableListener(nullptr);
  EXPECT_GE(index_->durable_commit(), second_commit);
  EXPECT_EQ(alloc_.parked_bytes(), 0u);
  EXPECT_EQ(alloc_.parked_for().count(), 0);
  auto last = alloc_.Reserve(kUnit);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, std::vector<PhysicalExtent>{second});
  Commit(*last, {});

  // Space freed by a batch already durable is usable at once.
  Commit({}, {second});
  ASSERT_TRUE(index_->Sync().ok());
  alloc_.Durable(index_->durable_commit());
  alloc_.Release({second}, index_->last_commit());
  EXPECT_EQ(alloc_.parked_bytes(), 0u);
  EXPECT_TRUE(alloc_.Reserve(kUnit).ok());
}

// A reservation that fits only with parked space asks the shortage handler
// (the filesystem syncs the index) and tries again, instead of ENOSPC.
TEST_F(AllocatorTest, ShortageHandlerMakesParkedSpaceUsable) {
  int calls = 0;
  index_->SetDurableListener([this](uint64_t commit) { alloc_.Durable(commit); });
  alloc_.SetShortageHandler([&] {
    ++calls;
    return index_->Sync();
  });
  auto all = alloc_.Reserve(kTotal);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(calls, 0) << "the handler ran although nothing was parked";
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
  EXPECT_EQ(calls, 0) << "the handler ran although nothing was parked";
  Commit(*all, {});
  const PhysicalExtent freed{kBase + 16 * kUnit, 4 * kUnit};
  Commit({}, {freed});
  const uint64_t commit = index_->last_commit();
  alloc_.Release({freed}, commit);
  EXPECT_LT(index_->durable_commit(), commit);

  // Holds may count on parked space; the reservation behind them syncs.
  ASSERT_TRUE(alloc_.Hold(4 * kUnit).ok());
  EXPECT_EQ(alloc_.Hold(kUnit).code(), ENOSPC);
  EXPECT_EQ(alloc_.available_bytes(), 0u);
  auto reserved = alloc_.Reserve(4 * kUnit, 4 * kUnit);
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(*reserved, std::vector<PhysicalExtent>{freed});
  EXPECT_EQ(calls, 1);
  EXPECT_GE(index_->durable_commit(), commit);
  // Nothing parked: a shortage is a real ENOSPC, without a sync.
  EXPECT_EQ(alloc_.Reserve(kUnit).status().code(), ENOSPC);
  EXPECT_EQ(calls, 1);
  alloc_.SetShortageHandler(nullptr);
  index_->SetDurableListener(nullptr);
}

// A shortage handler that cannot make parked space durable (the data area's
// sync failed): the reservation fails with its error, not with ENOSPC.
TEST_F(AllocatorTest, AFailedShortageHandlerIsTheReservationsError) {
  int calls = 0;
  alloc_.SetShortageHandler([&] {
    ++calls;
    return Status::IOError("data area sync failed");
  });
  ASSERT_NO_FATAL_FAILURE(ReserveAndCommit(kTotal));
  const PhysicalExtent freed{kBase, 2 * kUnit};
  Commit({}, {freed});
  alloc_.Release({freed}, index_->last_commit());
  auto reserved = alloc_.Reserve(kUnit);
  EXPECT_EQ(reserved.status().code(), EIO) << reserved.status().ToString();
  EXPECT_EQ(calls, 1);
  alloc_.SetShortageHandler(nullptr);
}

TEST_F(AllocatorTest, LoadRefusesAMalformedFreeList) {
  SetFree({{kBase, 4 * kUnit}, {kBase + 2 * kUnit, 4 * kUnit}});  // overlapping
  Allocator a(kUnit);
  EXPECT_EQ(a.Load(*index_).code(), EUCLEAN);
  SetFree({{kBase + 1, 4 * kUnit}});  // unaligned
  EXPECT_EQ(a.Load(*index_).code(), EUCLEAN);
  SetFree({{kBase, 0}});  // empty extent
  EXPECT_EQ(a.Load(*index_).code(), EUCLEAN);
  SetFree({{kBase, 4 * kUnit}, {kBase + 8 * kUnit, 4 * kUnit}});
  EXPECT_TRUE(a.Load(*index_).ok());
  EXPECT_EQ(a.available_bytes(), 8 * kUnit);
}

// Random reserve / unreserve / commit / free / release with a fixed seed. The
// model: every block is free, reserved, mapped or retired (freed, not yet
// released); no two live extents overlap, and the counters add up.
TEST_F(AllocatorTest, RandomizedSequenceKeepsTheBooks) {
  std::mt19937_64 rng(0x5eed);
  std::vector<std::vector<PhysicalExtent>> reserved, mapped, retired;
  uint64_t reserved_bytes = 0, mapped_bytes = 0, retired_bytes = 0;
  auto live_extents = [&]() {
    std::vector<PhysicalExtent> out;
    for (auto* group : {&reserved, &mapped, &retired}) {
      for (const auto& alloc : *group) out.insert(out.end(), alloc.begin(), alloc.end());
    }
    return out;
  };
  auto take = [&](std::vector<std::vector<PhysicalExtent>>* from) {
    size_t i = rng() % from->size();
    std::vector<PhysicalExtent> out = std::move((*from)[i]);
    (*from)[i] = std::move(from->back());
    from->pop_back();
    return out;
  };
  int nospace = 0;
  for (int step = 0; step < 3000; ++step) {
    int op = static_cast<int>(rng() % 100);
    if (op < 40) {
      uint64_t length = (1 + rng() % (rng() % 4 == 0 ? 64 : 8)) * kUnit;
      auto r = alloc_.Reserve(length);
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), ENOSPC);
        ASSERT_GT(length, kTotal - reserved_bytes - mapped_bytes - retired_bytes);
        ++nospace;
        continue;
      }
      ASSERT_EQ(Sum(*r), length);
      std::vector<PhysicalExtent> live = live_extents();
      for (const auto& e : *r) {
        ASSERT_EQ(e.offset % kUnit, 0u);
        ASSERT_EQ(e.length % kUnit, 0u);
        ASSERT_GE(e.offset, kBase);
        ASSERT_LE(e.offset + e.length, kBase + kTotal);
        for (const auto& l : live) ASSERT_FALSE(Overlap(e, l)) << "step " << step << ": " << e.offset;
      }
      for (size_t i = 0; i < r->size(); ++i) {
        for (size_t j = i + 1; j < r->size(); ++j) ASSERT_FALSE(Overlap((*r)[i], (*r)[j]));
      }
      reserved.push_back(std::move(r).value());
      reserved_bytes += length;
    } else if (op < 65 && !reserved.empty()) {
      // Commit one or two reservations, maybe freeing a mapping in the same batch.
      std::vector<PhysicalExtent> allocated = take(&reserved);
      if (!reserved.empty() && rng() % 2) {
        auto more = take(&reserved);
        allocated.insert(allocated.end(), more.begin(), more.end());
      }
      std::vector<PhysicalExtent> freed;
      if (!mapped.empty() && rng() % 2) freed = take(&mapped);
      reserved_bytes -= Sum(allocated);
      mapped_bytes += Sum(allocated) - Sum(freed);
      retired_bytes += Sum(freed);
      mapped.push_back(allocated);
      if (!freed.empty()) retired.push_back(freed);
      Commit(allocated, freed);
    } else if (op < 70 && !reserved.empty()) {
      auto r = take(&reserved);
      reserved_bytes -= Sum(r);
      alloc_.Unreserve(r);
    } else if (op < 85 && !mapped.empty()) {
      auto freed = take(&mapped);
      mapped_bytes -= Sum(freed);
      retired_bytes += Sum(freed);
      retired.push_back(freed);
      Commit({}, freed);
    } else if (!retired.empty()) {
      auto released = take(&retired);
      retired_bytes -= Sum(released);
      alloc_.Release(released);
    }
    ASSERT_EQ(alloc_.available_bytes() + reserved_bytes + mapped_bytes + retired_bytes, kTotal) << "step " << step;
    ASSERT_EQ(alloc_.persisted_free_bytes() + mapped_bytes, kTotal) << "step " << step;
    if (HasFailure()) return;
  }
  EXPECT_GT(nospace, 0) << "the sequence never filled the area";
  EXPECT_FALSE(mapped.empty());

  // Free everything: back to one extent covering the whole area.
  std::vector<PhysicalExtent> all_mapped;
  for (const auto& m : mapped) all_mapped.insert(all_mapped.end(), m.begin(), m.end());
  Commit({}, all_mapped);
  for (const auto& r : reserved) alloc_.Unreserve(r);
  alloc_.Release(all_mapped);
  for (const auto& r : retired) alloc_.Release(r);
  EXPECT_EQ(alloc_.available_bytes(), kTotal);
  EXPECT_EQ(alloc_.persisted(), (std::map<uint64_t, uint64_t>{{kBase, kTotal}}));
  EXPECT_EQ(StoredFree(), (std::map<uint64_t, uint64_t>{{kBase, kTotal}}));
}

}  // namespace
}  // namespace spillfs
