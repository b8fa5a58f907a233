// Must NOT compile under tools/check-thread-safety.sh: proves that the check's
// flags are in effect (a clang without -Wthread-safety, or annotations that
// expand to nothing, would let it through).
#include <cstdint>

#include "spillfs/common/mutex.h"
#include "spillfs/common/thread_annotations.h"

namespace {

class Counter {
 public:
  void Add(uint64_t n) { count_ += n; }  // the check must reject this: mu_ not held

 private:
  spillfs::Mutex mu_;
  uint64_t count_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter counter;
  counter.Add(1);
  return 0;
}
