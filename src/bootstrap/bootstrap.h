/*
 * Bootstrap: the out-of-band network that ties the ranks of a communicator
 * together before any transport exists, and serves setup-time exchanges.
 *
 * A unique id names a root listener. Each rank opens its own listener,
 * presents the id's secret to the root, and receives every rank's listener
 * address; the ranks then connect a ring (rank -> rank+1) for allgather and
 * barrier, and reach any rank directly for send/recv. Nothing here is on a
 * collective's data path.
 *
 * Every call is bounded by CFX_BOOTSTRAP_TIMEOUT and by the abort flag given
 * at init: a missing or dead peer is an error with a sentence, never a hang.
 */
#ifndef CFX_BOOTSTRAP_H
#define CFX_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "conflux.h"
#include "src/util/socket.h"

struct cfx_bootstrap;

/* Id flags. */
#define CFX_BOOTSTRAP_ID_COMM_ID 0x1u /* From CFX_COMM_ID: rank 0 starts the root. */
#define CFX_BOOTSTRAP_ID_LOCAL   0x2u /* All ranks in this process: loopback only. */

/* Fill @p id. Without CFX_COMM_ID (or with @p local), starts a root listener
 * thread in this process. @p local makes every rank listen on loopback. */
cfxResult_t cfx_bootstrap_id_create(cfxUniqueId *id, int local);

/* Whether @p id carries Conflux's magic (a cheap sanity check). */
int cfx_bootstrap_id_valid(const cfxUniqueId *id);

/* Join the communicator named by @p id as @p rank of @p nranks. Blocks until
 * every rank has joined, or fails with cfxTimeout naming the missing ranks.
 * @p abort_flag (may be NULL) is polled during every wait of this bootstrap. */
cfxResult_t cfx_bootstrap_init(const cfxUniqueId *id, int rank, int nranks, const int *abort_flag,
                               struct cfx_bootstrap **bs_p);

/* cfx_bootstrap_init through @p n_ids ids (cfxCommInitRankScalable), all
 * valid, distinct, none from CFX_COMM_ID, passed alike by every rank. The
 * ranks are split into n_ids contiguous blocks (the first nranks % n_ids
 * one larger); the root of ids[k] serves block k, and the root of ids[0]
 * also seats the first rank of every other block, which is how blocks
 * learn each other's listeners; each first rank then passes the whole
 * table along its block's ring. No root serves more than its block plus
 * n_ids - 1 ranks. One id is cfx_bootstrap_init. */
cfxResult_t cfx_bootstrap_init_scalable(const cfxUniqueId *ids, int n_ids, int rank, int nranks,
                                        const int *abort_flag, struct cfx_bootstrap **bs_p);

/* The block of ranks the root of ids[@p k] serves: *first_p, *size_p. */
void cfx_bootstrap_scalable_block(int nranks, int n_ids, int k, int *first_p, int *size_p);

/* Which id's root serves @p rank. */
int cfx_bootstrap_scalable_root_of(int nranks, int n_ids, int rank);

/* Whether @p id was made from CFX_COMM_ID; *secret_p gets its secret. */
int cfx_bootstrap_id_info(const cfxUniqueId *id, uint64_t *secret_p);

/* Build the bootstrap of a child communicator: collective over @p parent.
 * Ranks with equal @p color form a child ordered by (key, parent rank);
 * color < 0 takes part in the exchange and gets *child_p = NULL. */
cfxResult_t cfx_bootstrap_split(struct cfx_bootstrap *parent, int color, int key,
                                const int *abort_flag, struct cfx_bootstrap **child_p,
                                int *child_rank_p, int *child_nranks_p, int **parent_ranks_p);

/* Build the bootstrap of a communicator of @p parent's ranks but the
 * @p n_excluded of @p excluded (sorted, distinct, not this rank), ordered
 * as in the parent. Called by every remaining rank and by no excluded
 * one; never talks to an excluded rank (they may be dead): the remaining
 * ranks send their listen address to the first remaining rank over the
 * parent's point-to-point messages, and it answers each with the table.
 * Ranks that exclude different sets fail with cfxInvalidUsage and a
 * sentence naming the first rank that differs. */
cfxResult_t cfx_bootstrap_shrink(struct cfx_bootstrap *parent, const int *excluded, int n_excluded,
                                 const int *abort_flag, struct cfx_bootstrap **child_p,
                                 int *child_rank_p, int *child_nranks_p);

/* Point @p bs's waits at @p abort_flag (the communicator that now owns
 * it: a split or shrunk child must stop polling its parent's flag). */
void cfx_bootstrap_set_abort_flag(struct cfx_bootstrap *bs, const int *abort_flag);

/* Every rank contributes @p size bytes at data + rank*size and receives all. */
cfxResult_t cfx_bootstrap_allgather(struct cfx_bootstrap *bs, void *data, size_t size);

/* Returns once every rank has entered. */
cfxResult_t cfx_bootstrap_barrier(struct cfx_bootstrap *bs);

/* Largest point-to-point message: setup data only (connect info, mismatch
 * probes: a few hundred bytes). A receiver buffers a message that arrives
 * before it is asked for, so it refuses any larger header before allocating
 * anything; bulk exchanges go through cfx_bootstrap_allgather, which
 * receives into the caller's buffer. */
#define CFX_BOOTSTRAP_MAX_MESSAGE_BYTES ((uint64_t)4096)

/* Point-to-point messages matched by (peer, tag); sizes must agree and be at
 * most CFX_BOOTSTRAP_MAX_MESSAGE_BYTES (a larger send is cfxInternalError). */
cfxResult_t cfx_bootstrap_send(struct cfx_bootstrap *bs, int peer, uint32_t tag, const void *data,
                               size_t size);
cfxResult_t cfx_bootstrap_recv(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                               size_t size);
/* cfx_bootstrap_send that gives up after @p timeout_ms (a peer that may be gone). */
cfxResult_t cfx_bootstrap_send_within(struct cfx_bootstrap *bs, int peer, uint32_t tag,
                                      const void *data, size_t size, int timeout_ms);

/* CFX_BOOTSTRAP_TIMEOUT in seconds (0 = forever): also bounds transport connects. */
int64_t cfx_bootstrap_timeout_s(void);

/* cfx_bootstrap_recv without waiting: *got_p = 1 and the data when the
 * message is already here (or its connection is pending), else *got_p = 0. */
cfxResult_t cfx_bootstrap_try_recv(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                                   size_t size, int *got_p);

/* cfx_bootstrap_try_recv that waits up to @p timeout_ms for the message
 * (and files any other that arrives meanwhile): *got_p = 0 when it did not
 * come in time, which is not an error. */
cfxResult_t cfx_bootstrap_recv_within(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                                      size_t size, int timeout_ms, int *got_p);

int cfx_bootstrap_rank(const struct cfx_bootstrap *bs);
int cfx_bootstrap_nranks(const struct cfx_bootstrap *bs);
/* The listener address of @p peer, as the root gave it (tests and logs);
 * cfxInvalidArgument for a rank out of range. */
cfxResult_t cfx_bootstrap_peer_addr(const struct cfx_bootstrap *bs, int peer,
                                    union cfx_sockaddr *addr_p);

/* Close every socket and free; accepts NULL and half-built objects. */
void cfx_bootstrap_destroy(struct cfx_bootstrap *bs);

#endif /* CFX_BOOTSTRAP_H */
