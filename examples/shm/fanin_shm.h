/* fanin shared-memory ring, writer side (docs/sources.md, "shm:NAME", layout version 1):
 * the read-out process creates /dev/shm/NAME, writes STFs into its slots and closes it.
 *
 * Single header, C99 with GCC/Clang __atomic builtins, libc only (glibc < 2.34: -lrt).
 * With -std=c99 (not gnu99), define _POSIX_C_SOURCE 200809L before the first #include.
 * Functions return 0 or -errno. One thread writes one ring. */
#ifndef FANIN_SHM_H
#define FANIN_SHM_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fanin_shm.h: the ring is little-endian and so must the host be"
#endif

#define FANIN_SHM_HEADER_LEN 4096u
#define FANIN_SHM_MAX_SLOT_SIZE (UINT64_C(1) << 30)
#define FANIN_SHM_MAX_SLOTS (UINT64_C(1) << 20) /* the FLP's limit (crates/shm) */
enum { FANIN_SHM_FREE = 0, FANIN_SHM_WRITING = 1, FANIN_SHM_READY = 2 };

struct fanin_shm_header {  /* at offset 0 of the file; zero up to 4096 */
    uint64_t magic;        /* "FANINSHM" */
    uint32_t version, header_len;
    uint64_t slots, slot_size, write_seq, closed, reader_pid;
};

struct fanin_shm_entry {   /* the slot table: N of them from offset 4096 */
    uint32_t state, zero;
    uint64_t seq, tf_id, size;
    uint64_t scheduled_run, scheduled_seq; /* the FLP's own: never written here */
    uint64_t zero2[2];
};
typedef char fanin_shm_entry_is_64_bytes[sizeof(struct fanin_shm_entry) == 64 ? 1 : -1];

struct fanin_shm {
    int fd;
    uint8_t *map;
    uint64_t len, slots, slot_size;
    uint64_t seq;          /* the next STF's sequence number */
    uint64_t last_tf;      /* the tf_id of STF seq - 1 */
    char name[256];        /* "/NAME" */
};

static inline struct fanin_shm_header *fanin_shm_header_(struct fanin_shm *r) {
    return (struct fanin_shm_header *)r->map;
}

static inline struct fanin_shm_entry *fanin_shm_entry_(struct fanin_shm *r, uint64_t i) {
    return (struct fanin_shm_entry *)(r->map + FANIN_SHM_HEADER_LEN) + i;
}

static inline uint64_t fanin_shm_payloads_(uint64_t slots) {
    return FANIN_SHM_HEADER_LEN + (64 * slots + 4095) / 4096 * 4096;
}

static inline void fanin_shm_nap_(void) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* Creates /dev/shm/NAME (-EEXIST if it exists) with 1..2^20 slots of `slot_size`
 * payload bytes (a multiple of 4096, <= 1 GiB), all FREE. Its memory is reserved
 * here: a full /dev/shm gives -ENOSPC now rather than SIGBUS at a write. */
static inline int fanin_shm_create(struct fanin_shm *r, const char *name, uint64_t slots,
                                   uint64_t slot_size) {
    size_t n = strlen(name);
    if (n == 0 || strchr(name, '/')) return -EINVAL;
    if (n + 2 > sizeof r->name) return -ENAMETOOLONG;
    if (slots == 0 || slots > FANIN_SHM_MAX_SLOTS || slot_size == 0 || slot_size % 4096 ||
        slot_size > FANIN_SHM_MAX_SLOT_SIZE)
        return -EINVAL;
    r->name[0] = '/';
    memcpy(r->name + 1, name, n + 1);
    r->slots = slots;
    r->slot_size = slot_size;
    r->seq = r->last_tf = 0;
    r->len = fanin_shm_payloads_(slots) + slots * slot_size;
    if ((uint64_t)(size_t)r->len != r->len) return -EFBIG;
    r->fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (r->fd < 0) return -errno;
    int e = posix_fallocate(r->fd, 0, (off_t)r->len);
    void *m = e ? MAP_FAILED : mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (m == MAP_FAILED) {
        e = e ? e : errno;
        close(r->fd);
        shm_unlink(r->name);
        return -e;
    }
    r->map = m;
    struct fanin_shm_header *h = fanin_shm_header_(r);
    h->version = 1;
    h->header_len = FANIN_SHM_HEADER_LEN;
    h->slots = slots;
    h->slot_size = slot_size;
    uint64_t magic;
    memcpy(&magic, "FANINSHM", 8);
    __atomic_store_n(&h->magic, magic, __ATOMIC_RELEASE); /* last: a valid magic, a whole header */
    return 0;
}

static inline int fanin_shm_check_(struct fanin_shm *r, uint64_t tf_id, uint64_t size) {
    if (size > r->slot_size) return -EMSGSIZE;
    if (r->seq > 0 && tf_id <= r->last_tf) return -EINVAL; /* TF ids must grow */
    return 0;
}

/* Reserves the next STF's slot (state WRITING) and returns its payload, slot_size bytes
 * to fill in place. While the FLP has not freed the slot: waits if `wait`, else returns
 * NULL with errno = EAGAIN. Calling it again before fanin_shm_commit returns the same slot. */
static inline void *fanin_shm_slot(struct fanin_shm *r, int wait) {
    uint64_t i = r->seq % r->slots;
    struct fanin_shm_entry *e = fanin_shm_entry_(r, i);
    while (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) == FANIN_SHM_READY) {
        if (!wait) {
            errno = EAGAIN;
            return NULL;
        }
        fanin_shm_nap_();
    }
    __atomic_store_n(&e->state, FANIN_SHM_WRITING, __ATOMIC_RELAXED);
    return r->map + fanin_shm_payloads_(r->slots) + i * r->slot_size;
}

/* Publishes the reserved slot as STF (tf_id, size): -EMSGSIZE if size > slot_size,
 * -EINVAL if tf_id does not grow or no slot is reserved (the slot stays reserved). */
static inline int fanin_shm_commit(struct fanin_shm *r, uint64_t tf_id, uint64_t size) {
    struct fanin_shm_entry *e = fanin_shm_entry_(r, r->seq % r->slots);
    int rc = fanin_shm_check_(r, tf_id, size);
    if (rc) return rc;
    if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) != FANIN_SHM_WRITING) return -EINVAL;
    e->seq = r->seq;
    e->tf_id = tf_id;
    e->size = size;
    __atomic_store_n(&e->state, FANIN_SHM_READY, __ATOMIC_RELEASE);
    r->last_tf = tf_id;
    __atomic_store_n(&fanin_shm_header_(r)->write_seq, ++r->seq, __ATOMIC_RELEASE);
    return 0;
}

/* Copies one STF into the next slot: fanin_shm_slot, memcpy, fanin_shm_commit.
 * -EAGAIN if the ring is full and !wait; -EMSGSIZE, -EINVAL as fanin_shm_commit. */
static inline int fanin_shm_write(struct fanin_shm *r, uint64_t tf_id, const void *data,
                                  uint64_t size, int wait) {
    int rc = fanin_shm_check_(r, tf_id, size);
    if (rc) return rc;
    void *p = fanin_shm_slot(r, wait);
    if (!p) return -EAGAIN;
    memcpy(p, data, size);
    return fanin_shm_commit(r, tf_id, size);
}

/* Marks the ring closed (no STF follows; a reserved, uncommitted slot is dropped), waits
 * until the FLP freed every slot if `wait_empty` (for ever: the FLP must be attached),
 * unmaps it and removes /dev/shm/NAME if `unlink_it`. r is unusable after. */
static inline int fanin_shm_close(struct fanin_shm *r, int wait_empty, int unlink_it) {
    struct fanin_shm_entry *e = fanin_shm_entry_(r, r->seq % r->slots);
    if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) == FANIN_SHM_WRITING)
        __atomic_store_n(&e->state, FANIN_SHM_FREE, __ATOMIC_RELAXED);
    __atomic_store_n(&fanin_shm_header_(r)->closed, 1, __ATOMIC_RELEASE);
    for (uint64_t i = 0; wait_empty && i < r->slots;) {
        if (__atomic_load_n(&fanin_shm_entry_(r, i)->state, __ATOMIC_ACQUIRE) == FANIN_SHM_FREE)
            i++;
        else
            fanin_shm_nap_();
    }
    int rc = munmap(r->map, r->len) ? -errno : 0;
    if (close(r->fd) && !rc) rc = -errno;
    if (unlink_it && shm_unlink(r->name) && !rc) rc = -errno;
    r->map = NULL;
    r->fd = -1;
    return rc;
}

#endif
