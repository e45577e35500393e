/*
 * Shared bits of the libFuzzer harnesses: a reader that takes fixed-size
 * fields off the front of the input (short inputs read as zeros), and the
 * check that turns a broken invariant into a crash libFuzzer keeps.
 */
#ifndef CFX_FUZZ_FUZZ_H
#define CFX_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fuzz_input {
    const uint8_t *data;
    size_t size;
};

/* Copy the next @p size bytes into @p out (zeros past the end). */
static inline void fuzz_take(struct fuzz_input *in, void *out, size_t size)
{
    size_t n = in->size < size ? in->size : size;
    memcpy(out, in->data, n);
    memset((char *)out + n, 0, size - n);
    in->data += n;
    in->size -= n;
}

static inline uint32_t fuzz_u32(struct fuzz_input *in)
{
    uint32_t v;
    fuzz_take(in, &v, sizeof(v));
    return v;
}

static inline uint8_t fuzz_u8(struct fuzz_input *in)
{
    uint8_t v;
    fuzz_take(in, &v, sizeof(v));
    return v;
}

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Quiet: refusals log WARN lines, which would slow fuzzing to a crawl. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("CFX_DEBUG", "NONE", 1);
    setenv("CFX_CONF_FILE", "/nonexistent", 1);
    return 0;
}

#endif /* CFX_FUZZ_FUZZ_H */
