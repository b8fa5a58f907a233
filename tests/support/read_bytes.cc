#include "support/read_bytes.h"

namespace spillfs::testing {

Result<std::string> ReadBytes(Filesystem& fs, InodeNumber ino, uint64_t offset, size_t size) {
  AlignedBuffer scratch;
  std::string bytes;
  auto n = fs.Read(ino, offset, size, &scratch, [&](const iovec* pieces, int count) {
    for (int i = 0; i < count; ++i) bytes.append(static_cast<const char*>(pieces[i].iov_base), pieces[i].iov_len);
  });
  if (!n.ok()) return n.status();
  if (bytes.size() != *n) return Status::IOError("the read's pieces do not add up to its count");
  return bytes;
}

}  // namespace spillfs::testing
