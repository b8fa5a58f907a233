// stream_io w|r FILE MIB [direct] [nosync]: one sequential stream of 1 MiB write()s or read()s.
//   w: writes MIB MiB of random bytes (a 64 MiB random buffer, every 256 KiB stamped with its
//      offset so no two dedup units match), then fsync unless "nosync"; prints the write
//      phase, the fsync and the total.
//   r: reads FILE to its end (at most MIB MiB) and prints the rate.
// "direct" opens with O_DIRECT. Times the FUSE request path apart from the disk: a file in an
// ephemeral directory is written without an SSD write and read back from the RAM tier.
// Build: gcc -O2 stream_io.c -o stream_io
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: stream_io w|r FILE MIB [direct] [nosync]\n");
    return 2;
  }
  const size_t M = 1 << 20, pool = 64 * M, total = (size_t)atol(argv[3]) * M;
  int direct = 0, nosync = 0;
  for (int i = 4; i < argc; ++i) {
    if (!strcmp(argv[i], "direct")) direct = 1;
    if (!strcmp(argv[i], "nosync")) nosync = 1;
  }
  char* buf;
  if (posix_memalign((void**)&buf, 4096, pool)) return 1;
  uint64_t x = (uint64_t)time(0) ^ (uint64_t)getpid();
  for (size_t i = 0; i < pool / 8; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ((uint64_t*)buf)[i] = x;
  }
  const int writing = argv[1][0] == 'w';
  int fd = open(argv[2], (writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    perror(argv[2]);
    return 1;
  }
  double t0 = now();
  size_t done = 0;
  for (; done < total; done += M) {
    char* at = buf + done % pool;
    if (writing) {
      for (size_t k = 0; k < M; k += 256 << 10) memcpy(at + k, &done, sizeof done), at[k + 8] = (char)k;
      if (write(fd, at, M) != (ssize_t)M) return perror("write"), 1;
    } else {
      ssize_t got = read(fd, at, M);
      if (got < 0) return perror("read"), 1;
      if (got == 0) break;
    }
  }
  double t1 = now();
  if (writing && !nosync) fsync(fd);
  double t2 = now();
  close(fd);
  printf("%s %s%zu MiB: phase %.3f s, fsync %.3f s, %.0f MB/s\n", writing ? "write" : "read",
         direct ? "O_DIRECT " : "", done / M, t1 - t0, t2 - t1, done / (t2 - t0) / 1e6);
  return 0;
}
