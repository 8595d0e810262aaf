"""Write STFs into a fanin shared-memory ring (docs/sources.md, "shm:NAME", layout version 1)
as the read-out process that creates and owns /dev/shm/NAME. Pure Python (mmap only):
    with fanin_shm.Writer("ro1", 8, 1 << 20) as ring: ring.write(tf_id, payload)
"""
import mmap
import os
import sys
import time

if sys.byteorder != "little":
    raise ImportError("fanin_shm: the ring is little-endian and so must the host be")

HEADER_LEN = 4096
ENTRY_LEN = 64
MAX_SLOT_SIZE = 1 << 30
MAX_SLOTS = 1 << 20  # the FLP's limit (crates/shm)
FREE, WRITING, READY = 0, 1, 2
MAGIC = int.from_bytes(b"FANINSHM", "little")
NAP_S = 50e-6


class Writer:
    """A new ring /dev/shm/NAME (FileExistsError if it exists) of 1..2**20 slots of
    `slot_size` payload bytes (a multiple of 4096, <= 1 GiB).

    Every field is one aligned native store through a 32- or 64-bit view of the mapping,
    in the documented order: payload, seq, tf_id, size, then state = READY last. The FLP
    sees them in that order because x86-64 keeps stores in order; Python has no release
    store, so on weaker memory models (ARM, POWER) use the C or Rust client."""

    def __init__(self, name, slots, slot_size):
        if not name or "/" in name:
            raise ValueError(f"bad ring name {name!r}")
        ok = 1 <= slots <= MAX_SLOTS and 0 < slot_size <= MAX_SLOT_SIZE and slot_size % 4096 == 0
        if not ok:
            raise ValueError(f"{slots} slots of {slot_size} bytes: need 1..2**20 slots of a "
                             "multiple of 4096 bytes, <= 1 GiB")
        self.path, self.slots, self.slot_size = "/dev/shm/" + name, slots, slot_size
        self._payloads = HEADER_LEN + -(-ENTRY_LEN * slots // 4096) * 4096
        length = self._payloads + slots * slot_size
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, length)  # a full /dev/shm fails here, not at a write
            self._map = mmap.mmap(fd, length)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self._bytes = memoryview(self._map)
        self._u32, self._u64 = self._bytes.cast("I"), self._bytes.cast("Q")
        self._u32[2], self._u32[3] = 1, HEADER_LEN       # version, header_len
        self._u64[2], self._u64[3] = slots, slot_size
        self._u64[0] = MAGIC                             # last: a valid magic, a whole header
        self._seq, self._last_tf = 0, -1

    def write(self, tf_id, data, wait=True):
        """Writes one STF: `data` is any bytes-like object (bytes, bytearray, memoryview, a
        C-contiguous numpy array). While the FLP has not freed its slot: waits if `wait`,
        else returns False. True when written."""
        src = memoryview(data).cast("B")
        if src.nbytes > self.slot_size:
            raise ValueError(f"STF of {src.nbytes} bytes is over the slot size {self.slot_size}")
        if not self._last_tf < tf_id < 1 << 64:
            raise ValueError(f"tf_id {tf_id}: TF ids grow (the last was {self._last_tf}), < 2**64")
        i = self._seq % self.slots
        state, entry = (HEADER_LEN + ENTRY_LEN * i) // 4, (HEADER_LEN + ENTRY_LEN * i) // 8
        while self._u32[state] == READY:
            if not wait:
                return False
            time.sleep(NAP_S)
        self._u32[state] = WRITING
        start = self._payloads + i * self.slot_size
        self._bytes[start:start + src.nbytes] = src
        self._u64[entry + 1], self._u64[entry + 2] = self._seq, tf_id
        self._u64[entry + 3] = src.nbytes
        self._u32[state] = READY
        self._seq, self._last_tf = self._seq + 1, tf_id
        self._u64[4] = self._seq                         # write_seq
        return True

    def close(self, wait_empty=True, unlink=True, timeout=None):
        """Marks the ring closed (no STF follows), waits until the FLP freed every slot if
        `wait_empty` (at most `timeout` seconds if given), unmaps it and removes
        /dev/shm/NAME if `unlink`. False if the timeout passed first, else True."""
        if self._map is None:
            return True
        states = range(HEADER_LEN // 4, (HEADER_LEN + ENTRY_LEN * self.slots) // 4, ENTRY_LEN // 4)
        current = states[self._seq % self.slots]
        if self._u32[current] == WRITING:
            self._u32[current] = FREE                    # a write interrupted mid-copy
        self._u64[5] = 1                                 # closed
        deadline = None if timeout is None else time.monotonic() + timeout
        empty = True
        while wait_empty and any(self._u32[s] != FREE for s in states):
            if deadline is not None and time.monotonic() >= deadline:
                empty = False
                break
            time.sleep(NAP_S)
        for view in (self._u32, self._u64, self._bytes):
            view.release()
        self._map.close()
        self._map = None
        if unlink:
            os.unlink(self.path)
        return empty

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Closes the ring. After an exception it neither waits for the FLP nor removes
        the ring: the STFs still in it stay for an FLP that attaches again."""
        ok = exc_type is None
        self.close(wait_empty=ok, unlink=ok)
