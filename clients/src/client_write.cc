// spill_client: spill_write (reserve, write at queue depth, commit; in
// steps pipelined over two control handles).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <future>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "spillfs/common/block_checksum.h"

using namespace spillfs::client;
using spillfs::BlockChecksum;
using spillfs::RoundDown;
using spillfs::RoundUp;

int spill_client::Write(const char* path, const void* buf, size_t len) {
  std::string rel;
  int rc = Normalize(path, &rel);
  if (rc != 0) return rc;
  if (len > 0 && buf == nullptr) return Fail(EFAULT, "null buffer");
  const std::string file_path = MountPath(rel);
  int file = open(file_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (file < 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot create " + file_path, e));
  }
  rc = WriteOpen(rel, static_cast<const char*>(buf), len);
  if (close(file) != 0 && rc == 0) {
    int e = errno;
    rc = Fail(e, WithErrno("close of " + file_path, e));
  }
  return rc;
}

// The commit request, serialized by hand: a 1 GiB step carries 262144
// checksums, which a JSON DOM takes tens of milliseconds to build.
std::string spill_client::CommitText(const std::string& rel, uint64_t file_offset, uint64_t length, uint64_t size,
                                     const std::vector<uint32_t>& sums, const std::vector<uint64_t>* units,
                                     const std::vector<uint64_t>* ranges) {
  char num[24];  // a u64 has up to 20 digits
  auto numbers = [&](std::string* text, const auto& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) text->push_back(',');
      auto [end, ec] = std::to_chars(num, num + sizeof(num), values[i]);
      text->append(num, end);
    }
  };
  const bool ranged = ranges != nullptr && !ranges->empty();
  std::string text = R"({"op":"commit","path":)" + json(rel).dump();
  if (ranged) {
    text += R"(,"ranges":[)";
    numbers(&text, *ranges);
    text += "]";
  } else {
    text += R"(,"file_offset":)" + std::to_string(file_offset);
  }
  text += R"(,"length":)" + std::to_string(length) + R"(,"size":)" + std::to_string(size) + R"(,"block_checksums":[)";
  text.reserve(text.size() + sums.size() * 11 + 2);
  numbers(&text, sums);
  text += "]";
  if (units != nullptr && !units->empty()) {
    AppendUnitList(
        &text, units->size() / 3, [&](size_t i) { return (*units)[3 * i]; },
        [&](size_t i) { return units->data() + 3 * i + 1; });
  }
  text += "}";
  return text;
}

// Reserves `reserve_len` bytes on `txn`; fills *space and *fd.
int spill_client::Reserve(ControlChannel* txn, const std::string& rel, uint64_t reserve_len,
                          std::vector<std::pair<uint64_t, uint64_t>>* space, int* fd) {
  Phase phase("reserve", rel, reserve_len);
  const uint64_t bs = block_size;
  json reply;
  int rc =
      txn->Request(json{{spillfs::control::key::kOp, spillfs::control::op::kReserve}, {"length", reserve_len}}, &reply);
  if (rc != 0) return rc;
  if (!reply.is_object() || !reply.contains("extents") || !reply["extents"].is_array() ||
      !reply.contains("data_path") || !reply["data_path"].is_string()) {
    return Fail(EPROTO, "malformed reserve reply: " + reply.dump().substr(0, 200));
  }
  uint64_t reply_bs = bs;
  GetU64(reply, "block_size", &reply_bs);
  if (reply_bs != bs) return Fail(EPROTO, "reserve reply has another block size");
  uint64_t reserved = 0;
  for (const json& e : reply["extents"]) {
    uint64_t off = 0, n = 0;
    if (!e.is_object() || !GetU64(e, "physical_offset", &off) || !GetU64(e, "length", &n) || off % bs != 0 ||
        n % bs != 0 || n == 0) {
      return Fail(EPROTO, "malformed reserved extent: " + e.dump());
    }
    space->emplace_back(off, n);
    reserved += n;
  }
  if (reserved != reserve_len) {
    return Fail(EPROTO, "asked to reserve " + std::to_string(reserve_len) + " bytes, got " + std::to_string(reserved));
  }
  return DataFd(reply["data_path"].get<std::string>(), fd);
}

spill_client::Reservation spill_client::ReserveStep(ControlChannel* txn, const std::string& rel, uint64_t reserve_len) {
  Reservation r;
  r.rc = Reserve(txn, rel, reserve_len, &r.space, &r.fd);
  if (r.rc != 0) r.message = LastError();
  return r;
}

// Commits the step written at file offset `pos` on `txn` (which reserved
// it), then reserves the next step of `txn` (`next_len` bytes; none if 0).
spill_client::Reservation spill_client::CommitStep(ControlChannel* txn, const std::string& rel, uint64_t pos,
                                                   uint64_t length, uint64_t size, const std::vector<uint32_t>& sums,
                                                   uint64_t next_len, const std::vector<uint64_t>* units,
                                                   const std::vector<uint64_t>* ranges) {
  {
    Phase phase("commit", rel, length);
    std::string reply;
    json result;
    Reservation r;
    r.rc = txn->RequestText(CommitText(rel, pos, length, size, sums, units, ranges), "commit", &reply);
    if (r.rc == 0) r.rc = txn->ParseReply("commit", reply, &result);
    if (r.rc != 0) {
      r.message = LastError();
      return r;
    }
  }
  return next_len == 0 ? Reservation() : ReserveStep(txn, rel, next_len);
}

// Queues the block checksums of a step on the pool: `data_len` bytes at
// `base`, zero padded to `sums->size()` blocks (the bytes the store gets).
void spill_client::HashStep(TaskPool* pool, const char* base, uint64_t data_len, std::vector<uint32_t>* sums,
                            Latch* latch) {
  const uint64_t bs = block_size;
  const uint64_t per_task = std::max<uint64_t>(1, (1u << 20) / bs);  // blocks
  for (uint64_t first = 0; first < sums->size(); first += per_task) {
    const uint64_t last = std::min<uint64_t>(sums->size(), first + per_task);
    latch->Add();
    pool->Submit([=] {
      for (uint64_t b = first; b < last; ++b) {
        const uint64_t at = b * bs;
        if (at + bs <= data_len) {
          (*sums)[b] = BlockChecksum(base + at, bs);
        } else {  // the tail block
          std::vector<char> block(bs, 0);
          std::memcpy(block.data(), base + at, data_len - at);
          (*sums)[b] = BlockChecksum(block.data(), bs);
        }
      }
      latch->Done(0);
    });
  }
}

// Writes the file in steps of commit_bytes: reserve, write at queue depth,
// commit. Steps alternate between two control handles, since a handle
// commits exactly what it has reserved; while step k is written, a helper
// thread commits step k-1 on the other handle and reserves step k+1 there,
// so no round trip to the daemon stands between two steps' writes. The
// checksums are taken on the pool while the bytes are written.
int spill_client::WriteOpen(const std::string& rel, const char* src, size_t len) {
  if (len == 0) return 0;
  const uint64_t bs = block_size;
  const uint64_t step = std::max<uint64_t>(bs, RoundDown(commit_bytes.load(), bs));
  const uint64_t chunk = std::max<uint64_t>(bs, RoundDown(io_bytes.load(), bs));
  const uint64_t steps = (len + step - 1) / step;
  auto step_len = [&](uint64_t k) -> uint64_t {  // reserved bytes of step k (0: none)
    return k < steps ? RoundUp(std::min<uint64_t>(step, len - k * step), bs) : 0;
  };
  std::unique_ptr<ControlChannel> txn[2];  // hold the reservations; closing drops them
  int rc = OpenChannel(&txn[0]);
  if (rc != 0) return rc;
  if (steps > 1 && (rc = OpenChannel(&txn[1])) != 0) return rc;
  std::shared_ptr<TaskPool> pool = Pool();

  // pending[i]: handle i's helper work, whose result is its next step's space.
  std::future<Reservation> pending[2];
  auto settle = [&](int i, Reservation* out) -> int {
    Reservation r = pending[i].valid() ? pending[i].get() : Reservation();
    if (r.rc != 0) return Fail(-r.rc, r.message);
    if (out != nullptr) *out = std::move(r);
    return 0;
  };
  // Waits for both helpers; the first error (and its message, which a
  // later one would overwrite) is the one reported.
  auto settle_all = [&](int first_rc) {
    std::string message = LastError();
    int rc = first_rc;
    for (int i : {0, 1}) {
      int r = settle(i, nullptr);
      if (rc == 0 && r != 0) {
        rc = r;
        message = LastError();
      }
    }
    return rc == 0 ? 0 : Fail(-rc, message);
  };

  Reservation current = ReserveStep(txn[0].get(), rel, step_len(0));
  if (current.rc != 0) return Fail(-current.rc, current.message);
  if (steps > 1) {
    ControlChannel* other = txn[1].get();
    const uint64_t n = step_len(1);
    pending[1] = std::async(std::launch::async, [=, this] { return ReserveStep(other, rel, n); });
  }
  for (uint64_t k = 0; k < steps; ++k) {
    const int slot = static_cast<int>(k % 2);
    if (k > 0 && (rc = settle(slot, &current)) != 0) return settle_all(rc);
    const uint64_t pos = k * step;
    const uint64_t data_len = std::min<uint64_t>(step, len - pos);
    const uint64_t reserve_len = step_len(k);
    const char* base = src + pos;  // data of this step: [0, data_len)
    auto sums = std::make_shared<std::vector<uint32_t>>(reserve_len / bs);
    Latch hashed;
    if (checksums) HashStep(pool.get(), base, data_len, sums.get(), &hashed);  // else unused
    rc = WriteStep(rel, current, base, data_len, reserve_len, chunk);
    hashed.Wait();  // the tasks use this frame, even after an error
    if (rc != 0) return settle_all(rc);
    ControlChannel* channel = txn[slot].get();
    const uint64_t size = pos + data_len;
    const uint64_t next_len = step_len(k + 2);
    pending[slot] = std::async(std::launch::async,
                               [=, this] { return CommitStep(channel, rel, pos, reserve_len, size, *sums, next_len); });
  }
  return settle_all(0);
}

// Writes one step's bytes (`data_len` at `base`, padded with zeros to
// `reserve_len`) into the space of `r`, in I/Os of `chunk` bytes.
int spill_client::WriteStep(const std::string& rel, const Reservation& r, const char* base, uint64_t data_len,
                            uint64_t reserve_len, uint64_t chunk) {
  std::vector<IoOp> ops;
  uint64_t at = 0;  // offset in this step
  for (auto [off, n] : r.space) {
    for (uint64_t done = 0; done < n; done += chunk) {
      IoOp op;
      op.fd = r.fd;
      op.write = true;
      op.offset = off + done;
      op.length = static_cast<uint32_t>(std::min(chunk, n - done));
      op.tag = at;
      if (at + op.length <= data_len && Aligned(base + at)) op.buffer = const_cast<char*>(base + at);
      ops.push_back(op);
      at += op.length;
    }
  }
  IoFill fill = [&](const IoOp& op, char* slot_buf) -> int {
    uint64_t have = std::min<uint64_t>(op.length, data_len - op.tag);
    std::memcpy(slot_buf, base + op.tag, have);
    if (have < op.length) std::memset(slot_buf + have, 0, op.length - have);
    return 0;
  };
  IoDone done = [&](const IoOp& op, const char*) -> int {
    bytes_written.fetch_add(op.length, std::memory_order_relaxed);
    return 0;
  };
  uint64_t completed = 0;
  int rc;
  {
    Phase phase("write", rel, reserve_len);
    rc = RunIo(ops, queue_depth.load(), static_cast<uint32_t>(chunk), fill, done, &completed);
  }
  ios.fetch_add(completed, std::memory_order_relaxed);
  return rc;
}
