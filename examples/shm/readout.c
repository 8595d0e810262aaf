/* Example read-out for shm:NAME (docs/sources.md): writes COUNT STFs of SIZE bytes, tf_id
 * 0..COUNT-1, straight into a new ring NAME of 8 slots. Payload of TF t: splitmix64 seeded
 * with t * 1000 + FLP, each output as 8 little-endian bytes, the last cut to fit SIZE.
 *   cc -O2 -Iexamples/shm -o readout examples/shm/readout.c    (glibc < 2.34: add -lrt)
 *   ./readout ro1 1000 1048576 0 & fanin flp --source shm:ro1 ... */
#include <stdio.h>
#include <stdlib.h>
#include "fanin_shm.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: readout NAME COUNT SIZE [FLP]\n"); return 2; }
    uint64_t count = strtoull(argv[2], NULL, 10), size = strtoull(argv[3], NULL, 10);
    uint64_t flp = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    struct fanin_shm r;
    int rc = fanin_shm_create(&r, argv[1], 8, size > 4096 ? (size + 4095) / 4096 * 4096 : 4096);
    for (uint64_t tf = 0; rc == 0 && tf < count; tf++) {
        uint8_t *p = fanin_shm_slot(&r, 1); /* waits until the FLP freed the slot */
        uint64_t x = tf * 1000 + flp;
        for (uint64_t j = 0, v; j < size; j += 8) {
            v = splitmix64(&x);
            memcpy(p + j, &v, size - j < 8 ? size - j : 8);
        }
        rc = fanin_shm_commit(&r, tf, size);
    }
    if (rc == 0) rc = fanin_shm_close(&r, 1, 1); /* waits until the FLP freed every STF */
    if (rc) { fprintf(stderr, "readout: %s: %s\n", argv[1], strerror(-rc)); return 1; }
    printf("readout: wrote %llu STFs to /dev/shm/%s\n", (unsigned long long)count, argv[1]);
    return 0;
}
