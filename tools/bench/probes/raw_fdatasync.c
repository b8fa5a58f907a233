// Raw io_uring O_DIRECT write of 1 GiB (QD 16, 1 MiB requests) into FILE, then fdatasync; prints how
// long each took. With EVERY_MIB > 0 a second thread calls fdatasync each EVERY_MIB MiB completed.
// What the device charges for an fdatasync after a burst of writes, apart from spillfs.
// Build: gcc -O2 raw_fdatasync.c -o /tmp/rawt -luring -lpthread
// Run:   /tmp/rawt FILE FALLOCATE(0|1) EVERY_MIB
#define _GNU_SOURCE
#include <liburing.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
static volatile int want=0,stop=0; static int gfd; static void* syncer(void*a){ int seen=0; while(!stop){ if(want>seen){seen=want; fdatasync(gfd);} else usleep(500);} return 0;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){ size_t n=1<<30, M=1<<20; int qd=16; char*buf; posix_memalign((void**)&buf,4096,n);
 int r=open("/dev/urandom",O_RDONLY); for(size_t o=0;o<n;){ssize_t k=read(r,buf+o,n-o); o+=k;}
 int fd=open(v[1],O_DIRECT|O_WRONLY|O_CREAT|O_TRUNC,0644); if(atoi(v[2])) fallocate(fd,0,0,n); else ftruncate(fd,n);
 gfd=fd; pthread_t th; int every=atoi(v[3]); if(every) pthread_create(&th,0,syncer,0); struct io_uring ring; io_uring_queue_init(qd,&ring,0); size_t next=0,done=0,inf=0; double t0=now();
 while(done<n/M){ while(inf<qd&&next<n/M){struct io_uring_sqe*s=io_uring_get_sqe(&ring); io_uring_prep_write(s,fd,buf+next*M,M,next*M); next++;inf++;}
  io_uring_submit_and_wait(&ring,1); struct io_uring_cqe*cq; unsigned h,seen=0; io_uring_for_each_cqe(&ring,h,cq){seen++; if(cq->res!=M){printf("err %d\n",cq->res);return 1;}} io_uring_cq_advance(&ring,seen); inf-=seen; if(every && (done+seen)/every != done/every) want++; done+=seen;}
 double t1=now(); stop=1; if(every) pthread_join(th,0); fdatasync(fd); double t2=now(); printf("writes %.3f s fdatasync %.3f s total %.0f MB/s\n",t1-t0,t2-t1,n/(t2-t0)/1e6);}
