// 1 GiB of random bytes (generated in memory first) written to FILE in 1 MiB write()s, then fsync;
// prints the write phase, the fsync and the total. A third argument opens FILE with O_DIRECT.
// Used on the 2-core VM on 2026-12-05 (RESULTS.md, "the background sync of the data area").
// Build: gcc -O2 mount_writer.c -o /tmp/wr
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){ size_t n=1<<30,M=1<<20; char*buf; posix_memalign((void**)&buf,4096,n);
 unsigned long long x=time(0)^getpid(); for(size_t i=0;i<n/8;i++){x^=x<<13;x^=x>>7;x^=x<<17;((unsigned long long*)buf)[i]=x;}
 int fd=open(v[1],O_WRONLY|O_CREAT|O_TRUNC|(c>2?O_DIRECT:0),0644); double t0=now();
 for(size_t o=0;o<n;o+=M) if(write(fd,buf+o,M)!=M){perror("write");return 1;}
 double t1=now(); fsync(fd); double t2=now(); close(fd); printf("write %.3f fsync %.3f total %.0f MB/s\n",t1-t0,t2-t1,n/(t2-t0)/1e6);}
