/* Primitives: see prims.h. */
#include "src/coll/prims.h"

#include <stddef.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/reduce.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/time.h"

/* The oldest slot of @p conn, checked against what the op expects. */
static cfxResult_t take(struct cfx_op *op, struct cfx_connector *conn, size_t bytes,
                        const char **slot_p)
{
    size_t got;
    const struct cfx_fingerprint *print;
    /* The sender numbered the slot with its count of posts; ours of takes must agree. */
    uint32_t number = cfx_fifo_next_number(&conn->view);
    *slot_p = cfx_conn_take_slot(conn, &got, &print);
    struct cfx_fingerprint expect = op->expect;
    expect.slot = number;
    if (op->check_prints && print->slot != number &&
        memcmp(print, &expect, offsetof(struct cfx_fingerprint, slot)) == 0)
        return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                             "%s on rank %d: slot %u from rank %d arrived where slot %u was "
                             "expected; a slot was lost or repeated on the way",
                             cfx_coll_name(op->kind), op->rank, print->slot, conn->peer_rank,
                             number);
    if (op->check_prints && memcmp(print, &expect, sizeof(*print)) != 0) {
        char mine[160], theirs[160];
        cfx_coll_print_format(&op->expect, mine, sizeof(mine));
        cfx_coll_print_format(print, theirs, sizeof(theirs));
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "mismatched operations: rank %d runs %s but rank %d sent data of "
                             "%s; every rank must call the same collectives in the same order "
                             "with the same count, type, op and root",
                             op->rank, mine, conn->peer_rank, theirs);
    }
    if (got != bytes)
        return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                             "%s: rank %d received %zu bytes from rank %d where the schedule "
                             "expects %zu; the ranks disagree on the operation",
                             cfx_coll_name(op->kind), op->rank, got, conn->peer_rank, bytes);
    return cfxSuccess;
}

/* A received payload of @p bytes at @p slot, where a host thread can read
 * it: a slot in device memory is first copied into the connector's stage. */
static cfxResult_t readable(struct cfx_connector *conn, size_t bytes, const char **slot_p)
{
    if (conn->slots_device == 0 || bytes <= CFX_SLOT_INLINE_BYTES)
        return cfxSuccess; /* Host memory, or the info line (host memory too). */
    CFX_CHECK(
        cfx_cuda_copy(conn->stage, *slot_p, bytes, conn->slots_device - 1, conn->stage_stream));
    *slot_p = conn->stage;
    return cfxSuccess;
}

/* ------------------------------------------------------------ LL */

/* How long a host thread waits for an LL slot's words once its producer's
 * tail counted it (the words were stored before the tail: they are on the
 * way, unless the producer died between the two). */
#define LL_WORDS_WAIT_NS (10 * 1000000000ll)

/* Data words of an LL slot of @p bytes (zero-padded to 16 bytes). */
static size_t ll_data_words(size_t bytes)
{
    return ((bytes + 15) & ~(size_t)15) / 4;
}

/* A host thread reaches a connector's LL slots through its stage (every
 * transport that gives LL slots gives one); cfxInternalError if it has none. */
static cfxResult_t ll_stage(const struct cfx_op *op, const struct cfx_connector *conn)
{
    if (conn->stage != NULL)
        return cfxSuccess;
    return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                         "%s on rank %d: the LL slots shared with rank %d have no staging slot "
                         "for a host thread",
                         cfx_coll_name(op->kind), op->rank, conn->peer_rank);
}

/* Consumer: the oldest slot of @p conn, an LL slot (src/conn/fifo.h),
 * checked as take() checks a Simple one and decoded into the connector's
 * stage (*data_p): its words are copied there first when they live in
 * device memory, until every word carries the slot's flag. */
static cfxResult_t ll_take(struct cfx_op *op, struct cfx_connector *conn, size_t bytes,
                           const char **data_p)
{
    CFX_CHECK(ll_stage(op, conn));
    uint64_t number = cfx_load_relaxed_u64(conn->view.head);
    uint32_t flag = cfx_ll_flag(number);
    const uint64_t *slot = cfx_ll_slot(&conn->view, number);
    uint64_t *words = (uint64_t *)(void *)conn->stage;
    /* The producer wrote the size it sent: read the header first, then as
     * many words as the schedule expects (fewer when it sent less). */
    size_t n_words = CFX_LL_HEADER_WORDS + ll_data_words(bytes);
    int64_t deadline = 0;
    for (;;) {
        if (conn->slots_device != 0)
            CFX_CHECK(cfx_cuda_copy(words, slot, n_words * 8, conn->slots_device - 1,
                                    conn->stage_stream));
        else
            for (size_t i = 0; i < n_words; i++)
                words[i] = cfx_load_relaxed_u64(&slot[i]);
        size_t i = 0;
        uint32_t data;
        while (i < n_words && cfx_ll_load(&words[i], flag, &data))
            i++;
        if (i == n_words)
            break;
        if (i >= CFX_LL_HEADER_WORDS && (uint32_t)words[0] != bytes)
            break; /* Checked below. */
        if (op->abort_flag && __atomic_load_n(op->abort_flag, __ATOMIC_RELAXED))
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "%s on rank %d was aborted while LL slot %llu from rank %d "
                                 "arrived",
                                 cfx_coll_name(op->kind), op->rank, (unsigned long long)number,
                                 conn->peer_rank);
        int64_t now = cfx_time_now_ns();
        if (deadline == 0)
            deadline = now + LL_WORDS_WAIT_NS;
        else if (now > deadline)
            return cfx_error_set(cfxRemoteError, CFX_LOG_COLL,
                                 "%s on rank %d: rank %d counted LL slot %llu as sent but its "
                                 "words did not arrive within %lld s",
                                 cfx_coll_name(op->kind), op->rank, conn->peer_rank,
                                 (unsigned long long)number, LL_WORDS_WAIT_NS / 1000000000ll);
    }
    uint32_t got = (uint32_t)words[0], check = (uint32_t)words[1];
    if (op->check_prints && check != cfx_ll_check(&op->expect, (uint32_t)number)) {
        char mine[160];
        cfx_coll_print_format(&op->expect, mine, sizeof(mine));
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "mismatched operations: rank %d runs %s but rank %d sent data of "
                             "another operation (its LL check word differs); every rank must "
                             "call the same collectives in the same order with the same count, "
                             "type, op and root",
                             op->rank, mine, conn->peer_rank);
    }
    if (got != bytes)
        return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                             "%s: rank %d received %u bytes from rank %d where the schedule "
                             "expects %zu; the ranks disagree on the operation",
                             cfx_coll_name(op->kind), op->rank, got, conn->peer_rank, bytes);
    /* Decode in place: data word i (at byte 8i + 16) goes to byte 4i, below it. */
    char *data = conn->stage;
    for (size_t i = 0; i < ll_data_words(bytes); i++) {
        uint32_t d = (uint32_t)words[CFX_LL_HEADER_WORDS + i];
        memcpy(data + 4 * i, &d, 4);
    }
    *data_p = data;
    return cfxSuccess;
}

/* Producer: post the @p bytes at the start of @p to's stage (where the
 * step wrote them) as its next LL slot: encoded in place into words with
 * the slot's flag, stored into the slot, and counted by the tail. */
static cfxResult_t ll_post(struct cfx_op *op, struct cfx_connector *to, size_t bytes)
{
    uint64_t number = cfx_load_relaxed_u64(to->view.tail);
    uint32_t flag = cfx_ll_flag(number);
    size_t n_data = ll_data_words(bytes);
    char *data = to->stage;
    memset(data + bytes, 0, n_data * 4 - bytes);
    uint64_t *words = (uint64_t *)(void *)to->stage;
    /* Word i (at byte 8i + 16) comes from byte 4i, below it: last first. */
    for (size_t i = n_data; i-- > 0;) {
        uint32_t d;
        memcpy(&d, data + 4 * i, 4);
        words[CFX_LL_HEADER_WORDS + i] = cfx_ll_word(d, flag);
    }
    words[0] = cfx_ll_word((uint32_t)bytes, flag);
    words[1] = cfx_ll_word(cfx_ll_check(&op->print, (uint32_t)number), flag);
    uint64_t *slot = cfx_ll_slot(&to->view, number);
    size_t n_words = CFX_LL_HEADER_WORDS + n_data;
    if (to->slots_device != 0)
        CFX_CHECK(cfx_cuda_copy(slot, words, n_words * 8, to->slots_device - 1, to->stage_stream));
    else
        for (size_t i = 0; i < n_words; i++)
            cfx_store_relaxed_u64(&slot[i], words[i]);
    cfx_store_release_u64(to->view.tail, number + 1);
    return cfxSuccess;
}

/* Elements folded at a time through a stack buffer when the fold would
 * overwrite an in-place input before reading it. */
#define FOLD_BLOCK_BYTES 4096

/* out = operands[0] (op) operands[1] (op) ... (op) operands[n_operands-1],
 * strictly left to right. operands[input_pos] may be out itself (in place). */
static void fold_ordered(const struct cfx_op *op, char *out, const char *const *operands,
                         int n_operands, int input_pos, size_t n_elems)
{
    if (n_elems == 0)
        return;
    if (out != operands[input_pos] || input_pos < 2) {
        /* The input is read by the first reduction, or is not the output. */
        cfx_reduce_host(out, operands[0], operands[1], n_elems, op->type, op->op);
        for (int k = 2; k < n_operands; k++)
            cfx_reduce_host(out, out, operands[k], n_elems, op->type, op->op);
        return;
    }
    _Alignas(CFX_CACHE_LINE) char acc[FOLD_BLOCK_BYTES];
    size_t per = FOLD_BLOCK_BYTES / op->elem_bytes;
    for (size_t done = 0; done < n_elems; done += per) {
        size_t len = n_elems - done < per ? n_elems - done : per;
        size_t at = done * op->elem_bytes;
        cfx_reduce_host(acc, operands[0] + at, operands[1] + at, len, op->type, op->op);
        for (int k = 2; k < n_operands; k++)
            cfx_reduce_host(acc, acc, operands[k] + at, len, op->type, op->op);
        memcpy(out + at, acc, len * op->elem_bytes);
    }
}

/* Operations at least this large write their output with non-temporal
 * stores in copy_twice: it is read again only after the call, most of it
 * from memory anyway, and such stores skip reading each line before writing
 * it. */
#define NT_OUTPUT_MIN_BYTES ((size_t)8 << 20)

/* dst_a = dst_b = src, reading src once: a step that writes both its output
 * (dst_a) and a slot (dst_b) would otherwise read its value twice, and
 * these copies run at memory speed. The blocks go through registers (the
 * fixed-size copies become vector moves); with @p stream, dst_a's aligned
 * blocks are written with non-temporal stores. */
static void copy_twice(char *restrict dst_a, char *restrict dst_b, const char *restrict src,
                       size_t bytes, int stream)
{
    enum { BLOCK = 128 };
    size_t at = 0;
#if defined(__SSE2__)
    if (stream) {
        /* Plain copies up to dst_a's first 16-byte boundary. */
        size_t head = (size_t)(-(uintptr_t)dst_a & 15);
        if (head > bytes)
            head = bytes;
        memcpy(dst_a, src, head);
        memcpy(dst_b, src, head);
        for (at = head; at + BLOCK <= bytes; at += BLOCK) {
            __m128i v[BLOCK / 16];
            memcpy(v, src + at, BLOCK);
            memcpy(dst_b + at, v, BLOCK);
            for (int i = 0; i < BLOCK / 16; i++)
                _mm_stream_si128((__m128i *)(dst_a + at) + i, v[i]);
        }
        _mm_sfence();
    }
#else
    (void)stream;
#endif
    for (; at + BLOCK <= bytes; at += BLOCK) {
        char block[BLOCK];
        memcpy(block, src + at, BLOCK);
        memcpy(dst_a + at, block, BLOCK);
        memcpy(dst_b + at, block, BLOCK);
    }
    if (at < bytes) {
        memcpy(dst_a + at, src + at, bytes - at);
        memcpy(dst_b + at, src + at, bytes - at);
    }
}

void cfx_prim_copy_out(char *restrict dst, const char *restrict src, size_t bytes, size_t op_bytes)
{
#if defined(__SSE2__)
    if (op_bytes >= NT_OUTPUT_MIN_BYTES && bytes >= 4096) {
        enum { BLOCK = 128 };
        size_t head = (size_t)(-(uintptr_t)dst & 15), at;
        memcpy(dst, src, head);
        for (at = head; at + BLOCK <= bytes; at += BLOCK) {
            __m128i v[BLOCK / 16];
            memcpy(v, src + at, BLOCK);
            for (int i = 0; i < BLOCK / 16; i++)
                _mm_stream_si128((__m128i *)(dst + at) + i, v[i]);
        }
        _mm_sfence();
        memcpy(dst + at, src + at, bytes - at);
        return;
    }
#endif
    (void)op_bytes;
    memcpy(dst, src, bytes);
}

/* A single-copy step: the data moves by read_peer, slots carry addresses. */
static cfxResult_t run_single_copy(struct cfx_op *op, const struct cfx_step *step)
{
    unsigned flags = step->flags;
    size_t bytes = step->n_elems * op->elem_bytes;
    const char *value = step->input;
    if (flags & CFX_PRIM_RECV) {
        const char *slot;
        uint64_t remote;
        cfxResult_t res = take(op, op->conns[step->recv], sizeof(remote), &slot);
        if (res != cfxSuccess)
            return res;
        memcpy(&remote, slot, sizeof(remote));
        if (bytes && (res = cfx_conn_read_peer(op->conns[step->recv], step->output, remote,
                                               bytes)) != cfxSuccess) {
            struct cfx_connector *from = op->conns[step->recv];
            op->blame_rank = from->blame_rank >= 0 ? from->blame_rank : from->peer_rank;
            return res;
        }
        /* After the read: a sender that drains (point to point) may then
         * let go of its buffer. */
        cfx_conn_release(op->conns[step->recv]);
        value = step->output;
    }
    if (flags & CFX_PRIM_SEND) {
        uint64_t addr = (uint64_t)(uintptr_t)value;
        memcpy(cfx_conn_post_slot(op->conns[step->send], sizeof(addr)), &addr, sizeof(addr));
        cfx_conn_post(op->conns[step->send], sizeof(addr), &op->print);
    }
    /* After the announcement, so the peer reads while this rank copies. */
    if ((flags & CFX_PRIM_OUT) && step->output != value && bytes)
        memcpy(step->output, value, bytes);
    return cfxSuccess;
}

/* The handle a collective's send of @p bytes at @p from (NULL: not user
 * memory) may be posted by reference with over @p tr: any host memory for a
 * transport that moves it, else a registration of the output or the input
 * with the op's reg_transport that holds them; NULL: through the slots. */
static void *coll_ref_handle(const struct cfx_op *op, const struct cfx_transport *tr,
                             const char *from, uint64_t bytes)
{
    if (tr->flags & CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY)
        return CFX_REG_ANY_HOST;
    if (from == NULL || tr != op->reg_transport)
        return NULL;
    uint64_t in_bytes = (uint64_t)op->count * op->elem_bytes;
    uint64_t out_bytes =
        op->kind == CFX_COLL_ALLGATHER ? cfx_op_blocks_bytes(op, op->elem_bytes) : in_bytes;
    const char *out = op->recvbuff, *in = op->sendbuff;
    if (op->reg_out && from >= out && bytes <= out_bytes &&
        (uint64_t)(from - out) <= out_bytes - bytes)
        return op->reg_out;
    if (op->reg_in && from >= in && bytes <= in_bytes && (uint64_t)(from - in) <= in_bytes - bytes)
        return op->reg_in;
    return NULL;
}
/* The finish of a PreMulSum op: out[i] *= scalar, through the product
 * kernel against a run of copies of the scalar on the stack. */
static void premul_finish(const struct cfx_op *op, char *out, size_t n)
{
    enum { RUN = 64 };
    uint64_t scalars[RUN];
    size_t elem = op->elem_bytes;
    for (size_t i = 0; i < RUN; i++)
        memcpy((char *)scalars + i * elem, &op->premul_bits, elem);
    for (size_t done = 0; done < n; done += RUN) {
        size_t len = n - done < RUN ? n - done : RUN;
        cfx_reduce_host(out + done * elem, out + done * elem, scalars, len, op->type, cfxProd);
    }
}

/* The oldest slot of @p from, checked, where this thread can read it: an
 * LL slot decoded, a Simple one copied out of device memory (not when its
 * payload is @p in_place). */
static cfxResult_t take_readable(struct cfx_op *op, struct cfx_connector *from, size_t bytes,
                                 int in_place, const char **slot_p)
{
    if (cfx_prim_ll(op, from))
        return ll_take(op, from, bytes, slot_p);
    CFX_CHECK(take(op, from, bytes, slot_p));
    return in_place ? cfxSuccess : readable(from, bytes, slot_p);
}

cfxResult_t cfx_prim_run(struct cfx_op *op, const struct cfx_step *step)
{
    unsigned flags = step->flags;
    if (flags & (CFX_PRIM_PULL | CFX_PRIM_ADDR))
        return run_single_copy(op, step);
    if (flags & CFX_PRIM_DRAIN)
        return cfxSuccess; /* Ready means done. */
    if ((flags & CFX_PRIM_REF) && step->n_elems * op->elem_bytes > CFX_SLOT_INLINE_BYTES) {
        /* The transport takes the data from the user's registered buffer
         * (a payload small enough for the info line is copied there). */
        struct cfx_connector *to = op->conns[step->send];
        size_t bytes = step->n_elems * op->elem_bytes;
        cfxResult_t res = cfx_conn_post_ref(to, step->input, bytes, op->ref_handle);
        if (res != cfxSuccess)
            return res;
        cfx_conn_post_at(to, op->p2p_msg, (uint64_t)(step->input - (const char *)op->sendbuff));
        cfx_conn_post(to, bytes, &op->print);
        return cfxSuccess;
    }
    size_t n = step->n_elems;
    size_t bytes = n * op->elem_bytes;
    const char *received = NULL;
    const char *more[CFX_PRIM_MAX_RECV - 1];
    char *slot_out = NULL;
    if (flags & CFX_PRIM_RECV) {
        struct cfx_connector *from = op->conns[step->recv];
        int in_place = !cfx_prim_ll(op, from) && cfx_conn_in_place(from);
        cfxResult_t res = take_readable(op, from, bytes, in_place, &received);
        for (int i = 0; res == cfxSuccess && i < step->n_recv_more; i++)
            res = take_readable(op, op->conns[step->recv_more[i]], bytes, 0, &more[i]);
        if (res != cfxSuccess)
            return res;
        if (in_place) {
            /* The transport wrote it where this step would copy it (an
             * offer): only a plain receive, or a collective's copy of final
             * data (which may forward it), gets one. */
            int copy = (flags & (CFX_PRIM_REDUCE | CFX_PRIM_OUT)) == CFX_PRIM_OUT &&
                       step->n_recv_more == 0;
            if (!copy ||
                (op->kind == CFX_COLL_RECV ? (flags & CFX_PRIM_SEND) != 0 : op->coll_key == 0))
                return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                                     "%s on rank %d: rank %d's data landed in place for a step "
                                     "that is not a plain receive or copy",
                                     cfx_coll_name(op->kind), op->rank, from->peer_rank);
            received = step->output;
        }
    }
    char *device_slot = NULL; /* The slot in device memory slot_out stands in for. */
    /* Final output (or a stable input) of a collective whose transport moves
     * host memory from anywhere: sent from where it is (coll_key). */
    int final = (flags & (CFX_PRIM_SEND | CFX_PRIM_FINAL)) == (CFX_PRIM_SEND | CFX_PRIM_FINAL);
    int stable = (flags & (CFX_PRIM_SEND | CFX_PRIM_STABLE | CFX_PRIM_RECV | CFX_PRIM_REDUCE)) ==
                 (CFX_PRIM_SEND | CFX_PRIM_STABLE);
    void *ref = NULL;
    int ll_out = (flags & CFX_PRIM_SEND) && cfx_prim_ll(op, op->conns[step->send]);
    if (op->coll_key != 0 && (final || stable) && bytes > CFX_SLOT_INLINE_BYTES &&
        op->conns[step->send]->slots_device == 0 && !ll_out)
        ref = coll_ref_handle(op, op->conns[step->send]->transport,
                              (flags & CFX_PRIM_OUT)    ? step->output
                              : (flags & CFX_PRIM_RECV) ? NULL
                                                        : step->input,
                              bytes);
    int by_ref = ref != NULL;
    if (ll_out) {
        CFX_CHECK(ll_stage(op, op->conns[step->send]));
        slot_out = op->conns[step->send]->stage; /* Encoded in place at the post. */
    } else if ((flags & CFX_PRIM_SEND) && !by_ref) {
        struct cfx_connector *to = op->conns[step->send];
        slot_out = cfx_conn_post_slot(to, bytes);
        if (to->slots_device != 0 && bytes > CFX_SLOT_INLINE_BYTES) {
            device_slot = slot_out;
            slot_out = to->stage;
        }
    }

    /* The value this step produces: received (op) input [(op) more], or one of them. */
    const char *value = received ? received : step->input;
    char *sum = NULL; /* Where a reduction lands. */
    if (flags & CFX_PRIM_REDUCE) {
        sum = (flags & CFX_PRIM_OUT) ? step->output : slot_out;
        if (flags & CFX_PRIM_ORDERED) {
            const char *operands[CFX_PRIM_MAX_RECV + 1];
            int n_operands = 0;
            for (int i = 0; i <= step->n_recv_more; i++) {
                if (i == step->input_pos)
                    operands[n_operands++] = step->input;
                operands[n_operands++] = i == 0 ? received : more[i - 1];
            }
            if (step->input_pos == step->n_recv_more + 1)
                operands[n_operands++] = step->input;
            fold_ordered(op, sum, operands, n_operands, step->input_pos, n);
        } else {
            cfx_reduce_host(sum, received, step->input, n, op->type, op->op);
            for (int i = 0; i < step->n_recv_more; i++)
                cfx_reduce_host(sum, sum, more[i], n, op->type, op->op);
        }
        value = sum;
    }
    if ((flags & (CFX_PRIM_OUT | CFX_PRIM_SEND | CFX_PRIM_REDUCE | CFX_PRIM_AVG)) ==
            (CFX_PRIM_OUT | CFX_PRIM_SEND) &&
        step->output != value && bytes && !by_ref) {
        /* copy-send, recv-copy-send: one pass over the value (the input or a
         * received slot) for both copies. */
        copy_twice(step->output, slot_out, value, bytes,
                   op->count * op->elem_bytes >= NT_OUTPUT_MIN_BYTES);
    } else {
        if (flags & CFX_PRIM_OUT) {
            if (step->output != value && bytes)
                /* (Not streamed when the finish reads it back at once.) */
                cfx_prim_copy_out(step->output, value, bytes,
                                  (flags & CFX_PRIM_AVG) ? 0 : op->count * op->elem_bytes);
            if ((flags & CFX_PRIM_AVG) && op->premul)
                premul_finish(op, step->output, n);
            else if (flags & CFX_PRIM_AVG)
                cfx_reduce_avg_finish(step->output, step->output, n, op->type, op->nranks);
            value = step->output;
        }
        if ((flags & CFX_PRIM_SEND) && !by_ref && value != slot_out && bytes)
            memcpy(slot_out, value, bytes);
    }
    if (flags & CFX_PRIM_RECV) {
        cfx_conn_release(op->conns[step->recv]);
        for (int i = 0; i < step->n_recv_more; i++)
            cfx_conn_release(op->conns[step->recv_more[i]]);
    }
    if (ll_out)
        return ll_post(op, op->conns[step->send], bytes);
    if (flags & CFX_PRIM_SEND) {
        struct cfx_connector *to = op->conns[step->send];
        if (device_slot != NULL) {
            cfxResult_t res =
                cfx_cuda_copy(device_slot, slot_out, bytes, to->slots_device - 1, to->stage_stream);
            if (res != cfxSuccess)
                return res;
        }
        if (by_ref) {
            /* value is the output (written by this step, or by an earlier
             * one: a tree's later sends to children), final, or the stable
             * input: the transport sends it from there; the receiver's offer
             * of its own output takes final data at the same offset (the
             * layouts agree on every rank). */
            cfxResult_t res = cfx_conn_post_ref(to, value, bytes, ref);
            if (res != cfxSuccess)
                return res;
            if (final) /* A stable input is not the receiver's output: no mark. */
                cfx_conn_post_at(to, op->coll_key, (uint64_t)(step->output - (char *)op->recvbuff));
            op->ref_conns |= 1u << step->send;
        }
        if (op->kind == CFX_COLL_SEND)
            cfx_conn_post_at(op->conns[step->send], op->p2p_msg,
                             (uint64_t)(step->input - (const char *)op->sendbuff));
        cfx_conn_post(op->conns[step->send], bytes, &op->print);
    }
    return cfxSuccess;
}
