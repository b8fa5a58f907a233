// Helpers the benchmarks in tools/bench/ share: errors as exceptions, sizes,
// aligned buffers, seeded bytes, file descriptors, shell commands, the machine.
// Header-only; each bench is one process and one thread of setup.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace spillfs::bench {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBlock = 4096;

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void Die(const std::string& what) { throw Error(what); }
[[noreturn]] inline void DieErrno(const std::string& what) { Die(what + ": " + std::strerror(errno)); }

inline double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

inline uint64_t ParseSize(const std::string& text) {
  size_t pos = 0;
  double v = std::stod(text, &pos);
  std::string unit = text.substr(pos);
  uint64_t mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mult = 1ull << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    mult = 1ull << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    mult = 1ull << 30;
  else if (unit == "T" || unit == "t" || unit == "TiB")
    mult = 1ull << 40;
  else if (!unit.empty() && unit != "B")
    Die("bad size " + text);
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

inline std::string HumanSize(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{}G", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{}M", b >> 20);
  return fmt::format("{}", b);
}

// Aligned anonymous memory.
struct Buffer {
  char* data = nullptr;
  size_t size = 0;
  explicit Buffer(size_t n) : size(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) DieErrno(fmt::format("mmap of {} bytes", n));
    madvise(p, n, MADV_HUGEPAGE);
    data = static_cast<char*>(p);
  }
  ~Buffer() { munmap(data, size); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Incompressible, never-repeating bytes (so dedup finds nothing to share).
inline void FillRandom(char* p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    w[i] = s;
  }
  for (size_t i = n / 8 * 8; i < n; ++i) p[i] = static_cast<char>(i);
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull | 1) {}
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644) : path_(path) {
    fd_ = open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd_ < 0) DieErrno("open " + path);
  }
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Fsync() {
    if (fsync(fd_) != 0) DieErrno("fsync " + path_);
  }

 private:
  int fd_;
  std::string path_;
};

inline std::string Run(const std::string& command, int* status = nullptr) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) DieErrno("popen " + command);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int rc = pclose(pipe);
  int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (status != nullptr) {
    *status = code;
  } else if (code != 0) {
    Die(fmt::format("`{}` failed ({}): {}", command, code, out));
  }
  return out;
}

inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "?";
}

// A fresh directory PARENT/PREFIX-XXXXXX (PARENT made if missing).
inline std::string MakeWorkDir(const std::string& parent, const std::string& prefix) {
  std::filesystem::create_directories(parent);
  std::string tmpl = (std::filesystem::path(parent) / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) DieErrno("mkdtemp in " + parent);
  return tmpl;
}

}  // namespace spillfs::bench
