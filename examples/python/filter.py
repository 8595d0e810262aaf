"""A processing command for `fanin epn --sink exec:'python3 filter.py'`: reads built TFs
on stdin, keeps those whose first payload byte is even, and writes one line per kept TF
to stdout (the EPN keeps it beside its file sink's files as filtered output)."""
import sys

import fanin_tfs

kept = seen = 0
for tf in fanin_tfs.read_tfs(sys.stdin.buffer, check_crc=False):
    seen += 1
    first = tf.stfs[0].data[:1]
    if first and first[0] % 2 == 0:
        kept += 1
        size = sum(len(s.data) for s in tf.stfs)
        print(f"tf {tf.tf_id} kept {size} bytes from {len(tf.stfs)} FLPs", flush=True)
print(f"filter: kept {kept} of {seen} TFs", file=sys.stderr)
