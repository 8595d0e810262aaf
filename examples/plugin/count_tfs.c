/* An example fanin EPN plug-in (docs/sinks.md): counts TFs and bytes, sums every
 * payload byte, and refuses TFs whose id is a multiple of a given number.
 *   cc -shared -fPIC -O2 -o libcount_tfs.so count_tfs.c
 *   fanin epn ... --sink plugin:./libcount_tfs.so,counts.txt[,REFUSE_EVERY]
 * At run end it writes "tfs T bytes B sum S refused R" to counts.txt. */
#include <stdio.h>
#include <stdlib.h>
#include "fanin_sink.h"

static const char *out_path;
static uint64_t tfs, bytes, sum, refused, refuse_every;

int fanin_init(int argc, const char *const *argv) {
    if (argc < 2) { fprintf(stderr, "count_tfs: needs an output file\n"); return 1; }
    out_path = argv[1];
    refuse_every = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    return 0;
}

int fanin_tf(const struct fanin_tf *tf) {
    if (refuse_every && tf->tf_id % refuse_every == 0) { refused++; return 1; }
    tfs++;
    for (uint32_t i = 0; i < tf->n_stfs; i++) {
        const struct fanin_stf *s = &tf->stfs[i];
        bytes += s->len;
        for (uint64_t j = 0; j < s->len; j++) sum += s->data[j];
    }
    return 0;
}

void fanin_cleanup(void) {
    FILE *f = fopen(out_path, "w");
    if (!f) { perror(out_path); return; }
    fprintf(f, "tfs %llu bytes %llu sum %llu refused %llu\n", (unsigned long long)tfs,
            (unsigned long long)bytes, (unsigned long long)sum, (unsigned long long)refused);
    fclose(f);
}
