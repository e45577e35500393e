/*
 * ThreadSanitizer and the network. TSan orders a send on one socket and the
 * receive of those bytes on the other end only when both ends are one file
 * descriptor (a pipe); the two ends of a TCP connection are two. When the
 * ranks of a test are threads of one process, a rank's bytes can travel to
 * its peer and back (the ring: our chunk goes out, comes back reduced, and
 * lands in the buffer it was sent from) with no order TSan can see, and it
 * reports the receive's write against the send's read.
 *
 * cfx_tsan_* model a TCP connection as a channel, as TSan models a pipe:
 * the sender records its read of the bytes and releases the connection's
 * cell before the bytes enter the kernel; the receiver acquires the cell
 * and records its write after they left it. The cell is named by the
 * connection's address pair, which both ends see (in opposite roles). In
 * builds without TSan every function is the plain system call.
 */
#ifndef CFX_UTIL_TSAN_H
#define CFX_UTIL_TSAN_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#if defined(__SANITIZE_THREAD__)
#define CFX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CFX_TSAN 1
#endif
#endif
#ifndef CFX_TSAN
#define CFX_TSAN 0
#endif

#if CFX_TSAN
/* The connected socket's channel cell, as both ends name it (sending end:
 * from = local address, receiving end: from = peer address). */
void *cfx_tsan_socket_cell(int fd, int sending);
ssize_t cfx_tsan_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t cfx_tsan_recv(int fd, void *buf, size_t len, int flags);
#define CFX_SENDMSG cfx_tsan_sendmsg
#define CFX_RECV    cfx_tsan_recv
#else
#define CFX_SENDMSG sendmsg
#define CFX_RECV    recv
#endif

#endif
