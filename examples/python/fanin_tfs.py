"""Read fanin built-TF records (docs/sinks.md): TF files of the file and burst sinks,
an exec sink's stdin, a tap's stream. Pure Python; numpy is used only if you ask.

    import fanin_tfs
    for tf in fanin_tfs.read_tfs(open("epn0-000000.fanin", "rb")):
        print(tf.tf_id, [len(s.data) for s in tf.stfs])

    python3 fanin_tfs.py FILE...   # lists every TF and checks every CRC
"""
import struct
import sys
from collections import namedtuple

FILE_MAGIC = b"FANINTF1"
TF_MAGIC = b"FTF1"
TF_HEADER = struct.Struct("<4sHHQQII")   # magic, version, flags, run, tf, stfs, crc
STF_HEADER = struct.Struct("<IIQII")     # flp_id, crc32c of payload, len, crc of 0..16, 0
STF_HEADER_V1 = struct.Struct("<IIQ")    # version 1: flp_id, crc32c of payload, len

TF = namedtuple("TF", "run_id tf_id stfs")
STF = namedtuple("STF", "flp_id data crc_ok")


class Truncated(Exception):
    """The stream ends inside a record: every TF before it was whole."""


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC32C (Castagnoli), as the EPN computes it."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _read(f, n, what):
    b = f.read(n)
    if len(b) < n:
        raise Truncated(f"stream ends inside {what}")
    return b


def _stf_header(f, version, tf_id, check_crc):
    """(flp_id, payload crc, length) of the next STF header; version 2 checks its CRC."""
    if version == 1:
        return STF_HEADER_V1.unpack(_read(f, STF_HEADER_V1.size, "an STF header"))
    b = _read(f, STF_HEADER.size, "an STF header")
    flp_id, crc, length, own, zero = STF_HEADER.unpack(b)
    if zero != 0 or (check_crc and crc32c(b[:16]) != own):
        raise ValueError(f"TF {tf_id}: STF header CRC mismatch")
    return flp_id, crc, length


def read_tfs(f, check_crc=True):
    """Yields every TF of a binary stream; a file header, if present, is skipped."""
    first = f.read(TF_HEADER.size)
    if first.startswith(FILE_MAGIC):
        first = first[16:] + f.read(16)
    while first:
        if len(first) < TF_HEADER.size:
            raise Truncated("stream ends inside a TF header")
        magic, version, flags, run_id, tf_id, n, crc = TF_HEADER.unpack(first)
        if magic != TF_MAGIC or version not in (1, 2) or flags != 0:
            raise ValueError(f"not a TF record (magic {magic!r}, version {version})")
        if check_crc and crc32c(first[:28]) != crc:
            raise ValueError(f"TF {tf_id}: header CRC mismatch")
        stfs = []
        for _ in range(n):
            flp_id, crc, length = _stf_header(f, version, tf_id, check_crc)
            if stfs and stfs[-1].flp_id >= flp_id:
                raise ValueError(f"TF {tf_id}: STF of FLP {flp_id} out of FLP order")
            data = _read(f, length, "an STF payload")
            stfs.append(STF(flp_id, data, crc32c(data) == crc if check_crc else None))
        yield TF(run_id, tf_id, stfs)
        first = f.read(TF_HEADER.size)


def as_array(stf, dtype="uint8"):
    """An STF's payload as a numpy array (no copy); needs numpy."""
    import numpy as np
    return np.frombuffer(stf.data, dtype=dtype)


if __name__ == "__main__":
    bad = 0
    for path in sys.argv[1:]:
        count = size = 0
        try:
            with open(path, "rb") as f:
                for tf in read_tfs(f):
                    ok = all(s.crc_ok for s in tf.stfs)
                    bad += not ok
                    count += 1
                    size += sum(len(s.data) for s in tf.stfs)
                    print(f"tf {tf.tf_id} stfs {len(tf.stfs)} crc {'ok' if ok else 'BAD'}")
        except Truncated as e:
            print(f"{path}: {e}; every TF before it is whole")
        print(f"{path}: {count} TFs, {size} bytes")
    sys.exit(1 if bad else 0)
