/* fanin EPN plug-in interface (docs/sinks.md): the ANTARES DataFilter's
 * trigger_init / trigger_slice / trigger_cleanup, given pointers into the EPN's buffers.
 *
 * Build a plug-in:  cc -shared -fPIC -O2 -o libmyfilter.so myfilter.c
 * Use it:           fanin epn ... --sink plugin:./libmyfilter.so,ARG1,ARG2
 *
 * All three functions are called from one EPN thread, never at the same time. The
 * pointers in a fanin_tf are valid only during the fanin_tf call: copy what you keep. */
#ifndef FANIN_SINK_H
#define FANIN_SINK_H

#include <stdint.h>

#define FANIN_SINK_ABI 1

struct fanin_stf {
    uint32_t flp_id;       /* the FLP that sent this STF */
    uint32_t reserved;
    uint64_t len;          /* payload bytes */
    const uint8_t *data;   /* the payload, in the EPN's build buffer */
};

struct fanin_tf {
    uint64_t run_id;
    uint64_t tf_id;
    uint32_t epn_id;
    uint32_t n_stfs;       /* one per FLP of the run, in FLP order */
    uint64_t bytes;        /* sum of the STFs' len */
    const struct fanin_stf *stfs;
};

/* Called once when the run starts; argv[0] is the library's path, then the ARGs of
 * the sink spec. Non-zero: the EPN does not start. */
int fanin_init(int argc, const char *const *argv);

/* One built TF. 0: accepted. Non-zero: refused (the TF ends as dropped, sink_refused). */
int fanin_tf(const struct fanin_tf *tf);

/* Called once at run end. */
void fanin_cleanup(void);

#endif
