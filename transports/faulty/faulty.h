/*
 * The fault-injecting transport (SQLite's test_vfs.c, for connectors). When
 * CFX_FAULT is set it is the first transport in the registry: it accepts
 * every connection, carries it over the transport that would otherwise have
 * been chosen (shm, socket, ...), and breaks the slots that CFX_FAULT's rules
 * name as they arrive: drops them, holds them back, cuts them short, flips
 * bytes, or closes the connection. Unset, it accepts nothing and costs
 * nothing. For tests and for rehearsing failures; never in production.
 *
 * CFX_FAULT is a comma-separated list of rules, each a kind followed by
 * ":key=value" options (docs/troubleshooting.md has the whole table):
 *
 *   drop:rank=1:after=3          the 4th slot rank 1 receives on each
 *                                connection never arrives
 *   delay:ms=20                  every slot arrives 20 ms late
 *   truncate:rank=2:peer=1       rank 2 gets the first slot from rank 1
 *                                short (half its bytes)
 *   corrupt:what=print           a slot's fingerprint is altered
 *   close:rank=1:after_bytes=1M  rank 1 closes each connection it receives
 *                                on once 1 MiB has come through
 *   kill:rank=1:at=setup         rank 1 dies (SIGKILL) right after it set up
 *                                its first receive connector
 *
 * Faults act where slots arrive: `rank` is the receiving rank, `peer` the
 * sending one (ranks of the communicator the connection belongs to). Every
 * rank must see the same CFX_FAULT (both ends must pick this transport).
 */
#ifndef CFX_TRANSPORTS_FAULTY_FAULTY_H
#define CFX_TRANSPORTS_FAULTY_FAULTY_H

#include <stddef.h>
#include <stdint.h>

#include "transports/transport.h"

#define CFX_FAULT_MAX_RULES 8

enum cfx_fault_kind {
    CFX_FAULT_DROP = 1,     /* The slot never arrives (the sender sees it taken). */
    CFX_FAULT_DELAY = 2,    /* The slot arrives ms milliseconds after it came. */
    CFX_FAULT_TRUNCATE = 3, /* The slot arrives with fewer bytes than were sent. */
    CFX_FAULT_CORRUPT = 4,  /* One byte of the payload, or the fingerprint, is flipped. */
    CFX_FAULT_CLOSE = 5,    /* The receiver closes the connection. */
    CFX_FAULT_KILL = 6,     /* The receiving process dies of SIGKILL. */
};

enum cfx_fault_target { CFX_FAULT_DATA = 0, CFX_FAULT_PRINT = 1 };

/* When a kill strikes: as a slot arrives, or while a receive connector is
 * being made (after its setup, before its connect info leaves; or at the
 * start of its connect). */
enum cfx_fault_moment { CFX_FAULT_AT_DATA = 0, CFX_FAULT_AT_SETUP = 1, CFX_FAULT_AT_CONNECT = 2 };

/* One rule, as parsed. Counts are per connection. */
struct cfx_fault_rule {
    enum cfx_fault_kind kind;
    int rank;                   /* Receiving rank, or -1 for every rank. */
    int peer;                   /* Sending rank, or -1 for every peer. */
    uint64_t after;             /* Slots let through untouched first. */
    uint64_t after_bytes;       /* Payload bytes let through untouched first. */
    uint64_t count;             /* Slots hit per connection; 0: every one after. */
    int64_t ms;                 /* delay: how long. */
    int64_t keep;               /* truncate: bytes kept; -1: half the slot. */
    enum cfx_fault_target what; /* corrupt: payload or fingerprint. */
    uint64_t offset;            /* corrupt data: which byte (modulo the slot's size). */
    enum cfx_fault_moment at;   /* kill: when. */
};

struct cfx_fault_spec {
    int n_rules;
    struct cfx_fault_rule rules[CFX_FAULT_MAX_RULES];
};

/**
 * @brief Parse a CFX_FAULT value. Pure: no allocation, no logging.
 * @param [in]  text      The value (NULL or "" gives no rules).
 * @param [out] spec_p    The rules; written only on success.
 * @param [out] why       On failure, a sentence saying what is wrong and where.
 * @param [in]  why_size  Size of @p why.
 * @return cfxSuccess, or cfxInvalidArgument.
 */
cfxResult_t cfx_fault_spec_parse(const char *text, struct cfx_fault_spec *spec_p, char *why,
                                 size_t why_size);

/** @brief "drop", "delay", ... */
const char *cfx_fault_kind_name(enum cfx_fault_kind kind);

/**
 * @brief For tests: the description of @p rank that the core last passed
 * down to the fault injector's context @p ctx (through can_connect, for
 * this rank itself and a peer, or setup).
 * @param [in]  ctx     The context (the communicator's transport_ctx of this transport).
 * @param [in]  rank    A rank of the context's communicator.
 * @param [out] peer_p  The description; written only when one was seen.
 * @return 1 if one was seen, else 0.
 */
int cfx_faulty_peer_seen(const void *ctx, int rank, struct cfx_transport_peer *peer_p);

extern const struct cfx_transport cfx_faulty_transport;

#endif /* CFX_TRANSPORTS_FAULTY_FAULTY_H */
