"""Example read-out for shm:NAME (docs/sources.md): writes COUNT STFs of SIZE bytes, tf_id
0..COUNT-1, into a new ring NAME of 8 slots, then waits until the FLP freed them all.
Payload of TF t: random.Random(t * 1000 + FLP).randbytes(SIZE) (Python >= 3.9).

    python3 readout.py ro1 1000 1048576 0 [--rate 100] & fanin flp --source shm:ro1 ...
"""
import argparse
import random
import time

import fanin_shm

args = argparse.ArgumentParser(description="Write STFs into a fanin shm ring.")
args.add_argument("name")
args.add_argument("count", type=int)
args.add_argument("size", type=int, help="payload bytes of each STF")
args.add_argument("flp", type=int, help="seeds the payloads")
args.add_argument("--rate", type=float, default=0, help="STFs per second (default: as fast as freed)")
a = args.parse_args()

start = time.monotonic()
with fanin_shm.Writer(a.name, 8, max(1, -(-a.size // 4096)) * 4096) as ring:
    for tf in range(a.count):
        if a.rate:
            time.sleep(max(0.0, start + tf / a.rate - time.monotonic()))
        ring.write(tf, random.Random(tf * 1000 + a.flp).randbytes(a.size))
print(f"readout: wrote {a.count} STFs to {ring.path}")
