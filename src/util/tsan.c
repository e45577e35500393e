/* See tsan.h: TCP connections as channels for ThreadSanitizer. */
#include "src/util/tsan.h"

#if CFX_TSAN
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_read_range(void *addr, unsigned long size);
void __tsan_write_range(void *addr, unsigned long size);

/* Cells named by a hash of the address pair: two connections that share a
 * cell only gain an order TSan then assumes, they lose none. */
#define CELLS 4096
static char cells[CELLS];

static uint64_t hash_bytes(uint64_t h, const void *data, socklen_t len)
{
    const unsigned char *p = data;
    for (socklen_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void *cfx_tsan_socket_cell(int fd, int sending)
{
    struct sockaddr_storage local, peer;
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    memset(&local, 0, sizeof(local));
    memset(&peer, 0, sizeof(peer));
    if (getsockname(fd, (struct sockaddr *)&local, &local_len) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &peer_len) != 0)
        return &cells[0];
    uint64_t h = 0xcbf29ce484222325ull;
    if (sending) {
        h = hash_bytes(h, &local, local_len);
        h = hash_bytes(h, &peer, peer_len);
    } else {
        h = hash_bytes(h, &peer, peer_len);
        h = hash_bytes(h, &local, local_len);
    }
    return &cells[h % CELLS];
}

/* The system calls themselves, past TSan's interceptors (which would
 * record the accesses at the wrong side of the release and acquire). */
ssize_t cfx_tsan_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    for (size_t i = 0; i < msg->msg_iovlen; i++)
        __tsan_read_range(msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
    __tsan_release(cfx_tsan_socket_cell(fd, 1));
    return syscall(SYS_sendmsg, fd, msg, flags);
}

ssize_t cfx_tsan_recv(int fd, void *buf, size_t len, int flags)
{
    ssize_t n = syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
    if (n > 0) {
        __tsan_acquire(cfx_tsan_socket_cell(fd, 0));
        __tsan_write_range(buf, (unsigned long)n);
    }
    return n;
}
#endif
