#!/usr/bin/env bash
# Ran on the CPU VM on 2026-12-04 (third session) with the experiment build of aff03ad described in
# dio_ra_ab.sh (EXP_DIO=1: write-only handles get direct_io), RelWithDebInfo in build/; /tmp/ts.py was:
#   import torch, sys, os, time
#   t = torch.empty(1024*1024*1024//4, dtype=torch.float32).uniform_()
#   a=time.time()
#   with open(sys.argv[1], "wb") as f:
#       torch.save(t, f)
#       f.flush(); os.fsync(f.fileno())
#   print("%.0f" % (1024/(time.time()-a)))
S=/work/main/build/bin/spillfs
D=/var/tmp/tsab; rm -rf $D; mkdir -p $D/m
$S mkfs $D/vol --size 8G >/dev/null || exit 1
for r in 1 2; do for mode in base dio; do
  if [ $mode = dio ]; then EXP_DIO=1 $S mount $D/vol $D/m >/dev/null; else $S mount $D/vol $D/m >/dev/null; fi
  a=$(/usr/bin/python3 /tmp/ts.py $D/m/x.pt); rm $D/m/x.pt
  b=$(/usr/bin/python3 /tmp/ts.py $D/m/x.pt); rm $D/m/x.pt
  echo "round $r $mode: torch.save 1G+fsync $a $b MB/s; $(grep -E 'flush|written_ssd' $D/m/.spillfs/stats | tr '\n' ' ')"
  $S umount $D/m >/dev/null
done; done
rm -rf $D
