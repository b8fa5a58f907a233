#include "spillfs/store/buffer_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "spillfs/common/aligned_buffer.h"

namespace spillfs {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr size_t kBuffer = 256 << 10;
constexpr size_t kSlab = 4 << 20;

TEST(BufferPoolTest, BuffersAreAlignedDistinctAndRecycled) {
  BufferPool pool(kBuffer, kSlab);
  std::set<char*> seen;
  std::vector<char*> held;
  for (int i = 0; i < 40; ++i) {
    char* b = pool.Acquire().value();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(b) % 4096, 0u);
    ASSERT_TRUE(seen.insert(b).second) << "buffer handed out twice";
    std::memset(b, i, kBuffer);
    held.push_back(b);
  }
  size_t reserved = pool.reserved_bytes();
  EXPECT_EQ(reserved, 3 * kSlab);  // 40 buffers of 16 per slab
  for (char* b : held) pool.Release(b);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(seen.count(pool.Acquire().value()));
  EXPECT_EQ(pool.reserved_bytes(), reserved) << "released buffers must be reused, not remapped";
}

// Pages of [buffer, buffer + bytes) resident in memory.
size_t ResidentPages(const char* buffer, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core(bytes / page);
  if (mincore(const_cast<char*>(buffer), bytes, in_core.data()) != 0) return 0;
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return resident;
}

// MADV_POPULATE_WRITE (Linux 5.14+) on a scratch mapping.
bool KernelPopulatesWrite() {
  void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return false;
  bool ok = madvise(probe, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
  munmap(probe, 4096);
  return ok;
}

TEST(BufferPoolTest, WarmFaultsInSlabsBeforeTheyAreUsed) {
  if (!KernelPopulatesWrite())
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14+): Warm does nothing";
  const size_t pages = kBuffer / static_cast<size_t>(sysconf(_SC_PAGESIZE));
  BufferPool cold(kBuffer, kSlab);
  EXPECT_EQ(ResidentPages(cold.Acquire().value(), kBuffer), 0u) << "an untouched buffer of a cold pool";
  BufferPool warm(kBuffer, kSlab);
  warm.Warm(3 * kSlab + kSlab / 2);
  EXPECT_EQ(warm.reserved_bytes(), 3 * kSlab);  // whole slabs, at most the bytes asked for
  std::vector<char*> held;
  for (size_t i = 0; i < 3 * kSlab / kBuffer; ++i) {
    held.push_back(warm.Acquire().value());
    EXPECT_EQ(ResidentPages(held.back(), kBuffer), pages) << "buffer " << i << " of a warmed pool";
  }
  EXPECT_EQ(warm.reserved_bytes(), 3 * kSlab) << "the warmed slabs are used before new ones are mapped";
  warm.Warm(kSlab);  // already holds that much
  EXPECT_EQ(warm.reserved_bytes(), 3 * kSlab);
  BufferPool small(kBuffer, kSlab);
  small.Warm(kSlab - 1);  // less than a slab: nothing
  EXPECT_EQ(small.reserved_bytes(), 0u);
}

// The buffer released last is the next one handed out: a writer whose data
// is flushed as it goes keeps reusing the few buffers still in cache.
TEST(BufferPoolTest, MostRecentlyReleasedBufferComesBackFirst) {
  BufferPool pool(kBuffer, kSlab);
  std::vector<char*> held;
  for (int i = 0; i < 20; ++i) held.push_back(pool.Acquire().value());
  pool.Release(held[7]);
  pool.Release(held[3]);
  EXPECT_EQ(pool.Acquire().value(), held[3]);
  EXPECT_EQ(pool.Acquire().value(), held[7]);
  for (char* b : held) pool.Release(b);
}

// Threads taking and returning buffers never share one, and the pool grows
// only to what was held at once.
TEST(BufferPoolTest, ConcurrentUsersNeverShareABuffer) {
  BufferPool pool(kBuffer, kSlab);
  constexpr int kThreads = 4;
  constexpr int kHeld = 8;
  std::atomic<int> clobbered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        char* mine[kHeld];
        for (char*& b : mine) {
          b = pool.Acquire().value();
          std::memset(b, t + 1, 64);
        }
        for (char* b : mine) {
          for (int i = 0; i < 64; ++i) clobbered += b[i] != static_cast<char>(t + 1);
          pool.Release(b);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clobbered.load(), 0);
  EXPECT_LE(pool.reserved_bytes(), 2 * kSlab) << "at most 32 buffers were ever held at once";
}

// Out of memory is an answer: where no slab can be mapped, Acquire returns
// ENOMEM (the write that wanted the buffer fails with it), and the pool goes
// on handing out the buffers it has.
TEST(BufferPoolTest, AcquireAnswersEnomemWhenNoSlabCanBeMapped) {
  bool fail = false;
  BufferPool pool(kBuffer, kSlab, [&] { return fail; });
  std::vector<char*> held;
  for (size_t i = 0; i < kSlab / kBuffer; ++i) held.push_back(pool.Acquire().value());
  fail = true;
  auto none = pool.Acquire();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ENOMEM);
  EXPECT_EQ(pool.reserved_bytes(), kSlab);
  pool.Release(held.back());
  auto again = pool.Acquire();
  ASSERT_TRUE(again.ok()) << "a released buffer is handed out without a new slab";
  EXPECT_EQ(*again, held.back());
  fail = false;
  EXPECT_TRUE(pool.Acquire().ok()) << "memory back: a new slab";
  EXPECT_EQ(pool.reserved_bytes(), 2 * kSlab);
}

TEST(BufferPoolTest, WarmStopsAtTheFirstSlabThatCannotBeMapped) {
  int slabs = 0;
  BufferPool pool(kBuffer, kSlab, [&] { return ++slabs > 2; });
  pool.Warm(8 * kSlab);
  EXPECT_EQ(pool.reserved_bytes(), 2 * kSlab);
  EXPECT_EQ(slabs, 3) << "one failed mapping ends the warm-up";
}

TEST(BufferPoolTest, PooledBufferTakeAnswersEnomem) {
  BufferPool pool(kBuffer, kSlab, [] { return true; });
  auto buffer = PooledBuffer::Take(&pool);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), ENOMEM);
}

// The aligned buffers of the read and write paths answer ENOMEM too, and
// stay as they were.
TEST(AlignedBufferTest, ResizeAnswersEnomemAndKeepsTheBuffer) {
  AlignedBuffer buffer;
  ASSERT_TRUE(buffer.Resize(8192).ok());
  std::memset(buffer.data(), 7, 8192);
  char* before = buffer.data();
  // 2^62 bytes reach aligned_alloc, which returns null; AddressSanitizer
  // would report the request instead (allocator_may_return_null=0), so
  // sanitized builds try only the size no allocator is asked for.
  std::vector<size_t> sizes = {SIZE_MAX - 1};
  if (!kSanitized) sizes.push_back(size_t{1} << 62);
  for (size_t impossible : sizes) {
    Status s = buffer.Resize(impossible);
    EXPECT_EQ(s.code(), ENOMEM) << impossible << ": " << s.ToString();
    EXPECT_EQ(buffer.data(), before);
    EXPECT_EQ(buffer.size(), 8192u);
  }
  EXPECT_EQ(buffer.data()[8191], 7);
  EXPECT_TRUE(buffer.Resize(4096).ok());
  EXPECT_EQ(buffer.data(), before) << "a smaller size needs no new memory";
}

}  // namespace
}  // namespace spillfs
