// HandleTable (spillfs/common/handle_table.h): handles taken back are the
// caller's, and those never taken back are freed with the table (a daemon
// stopped with files open); under SPILLFS_SANITIZE=ON a leak or a double
// free shows here.
#include "spillfs/common/handle_table.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

namespace spillfs {
namespace {

// Counts the handles alive.
struct Counted {
  explicit Counted(int* alive) : alive(alive) { ++*alive; }
  ~Counted() { --*alive; }
  int* alive;
};

TEST(HandleTableTest, TakenHandlesAreTheCallersAndTheRestGoWithTheTable) {
  int alive = 0;
  {
    HandleTable<Counted> table;
    Counted* first = table.Add(std::make_unique<Counted>(&alive));
    Counted* second = table.Add(std::make_unique<Counted>(&alive));
    table.Add(std::make_unique<Counted>(&alive));
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(table.size(), 3u);
    std::unique_ptr<Counted> taken = table.Take(first);
    EXPECT_EQ(taken.get(), first);
    EXPECT_EQ(table.Take(first), nullptr) << "taken twice";
    EXPECT_EQ(table.Take(nullptr), nullptr);
    taken.reset();
    table.Free(second);
    table.Free(nullptr);
    EXPECT_EQ(alive, 1);
    EXPECT_EQ(table.size(), 1u);
  }
  EXPECT_EQ(alive, 0) << "the handle never taken back outlived the table";
}

TEST(HandleTableTest, TakeAllEmptiesTheTable) {
  int alive = 0;
  HandleTable<Counted> table;
  for (int i = 0; i < 4; ++i) table.Add(std::make_unique<Counted>(&alive));
  std::vector<std::unique_ptr<Counted>> all = table.TakeAll();
  EXPECT_EQ(all.size(), 4u);
  EXPECT_EQ(table.size(), 0u);
  all.clear();
  EXPECT_EQ(alive, 0);
}

// Opens and releases come from every FUSE worker at once.
TEST(HandleTableTest, AddAndFreeFromManyThreads) {
  HandleTable<int> table;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&table, t] {
      for (int i = 0; i < 1000; ++i) {
        int* handle = table.Add(std::make_unique<int>(t));
        ASSERT_EQ(*handle, t);
        if (i % 2 == 0) table.Free(handle);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(table.size(), 2000u);
}

}  // namespace
}  // namespace spillfs
