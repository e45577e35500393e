/* TCP sockets: see socket.h. */
#include "src/util/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

/* CFX_SOCKET_FAMILY: the range 0..6 admits 1, 2, 3 and 5 too. */
static const char *check_family(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return strcmp(text, "0") == 0 || strcmp(text, "4") == 0 || strcmp(text, "6") == 0
               ? NULL
               : "expected 4 (IPv4), 6 (IPv6), or 0 for either";
}

const char *cfx_socket_addr_param_check(const char *text, char *buf, size_t len)
{
    union cfx_sockaddr addr;
    if (cfx_socket_addr_parse(text, &addr) != cfxSuccess) {
        snprintf(buf, len, "expected host:port or [ipv6]:port with a port from 1 to 65535 (%s)",
                 cfx_error_thread_last());
        cfx_error_thread_clear();
        return buf;
    }
    in_port_t port = addr.sa.sa_family == AF_INET6 ? addr.sin6.sin6_port : addr.sin.sin_port;
    if (port == 0)
        return "expected host:port with a port from 1 to 65535; port 0 would bind a random "
               "port that the other ranks cannot know";
    return NULL;
}

CFX_PARAM_STR(socket_ifname, "SOCKET_IFNAME", NULL,
              "Interfaces for sockets: prefix list, ^ excludes, = exact (NCCL syntax)");
CFX_PARAM_INT_CHECKED(socket_family, "SOCKET_FAMILY", 0, 0, 6, check_family,
                      "Address family for sockets: 4, 6, or 0 for either");

#define POLL_SLICE_MS 100

static int aborted(const int *abort_flag)
{
    return abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE);
}

void cfx_socket_addr_to_wire(const union cfx_sockaddr *addr, struct cfx_sockaddr_wire *wire_p)
{
    memset(wire_p, 0, sizeof(*wire_p));
    wire_p->family = addr->sa.sa_family;
    if (addr->sa.sa_family == AF_INET) {
        wire_p->port = addr->sin.sin_port;
        memcpy(wire_p->addr, &addr->sin.sin_addr, 4);
    } else {
        wire_p->port = addr->sin6.sin6_port;
        wire_p->scope_id = addr->sin6.sin6_scope_id;
        memcpy(wire_p->addr, &addr->sin6.sin6_addr, 16);
    }
}

cfxResult_t cfx_socket_addr_from_wire(const struct cfx_sockaddr_wire *wire,
                                      union cfx_sockaddr *addr_p)
{
    union cfx_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    if (wire->family == AF_INET) {
        addr.sin.sin_family = AF_INET;
        addr.sin.sin_port = wire->port;
        memcpy(&addr.sin.sin_addr, wire->addr, 4);
    } else if (wire->family == AF_INET6) {
        addr.sin6.sin6_family = AF_INET6;
        addr.sin6.sin6_port = wire->port;
        addr.sin6.sin6_scope_id = wire->scope_id;
        memcpy(&addr.sin6.sin6_addr, wire->addr, 16);
    } else {
        return cfxInvalidArgument;
    }
    *addr_p = addr;
    return cfxSuccess;
}

socklen_t cfx_socket_addr_len(const union cfx_sockaddr *addr)
{
    return addr->sa.sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

void cfx_socket_addr_format(const union cfx_sockaddr *addr, char *text, size_t size)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &addr->sin.sin_addr, host, sizeof(host));
        snprintf(text, size, "%s:%u", host, ntohs(addr->sin.sin_port));
    } else if (addr->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &addr->sin6.sin6_addr, host, sizeof(host));
        snprintf(text, size, "[%s]:%u", host, ntohs(addr->sin6.sin6_port));
    } else {
        snprintf(text, size, "(family %d)", addr->sa.sa_family);
    }
}

cfxResult_t cfx_socket_addr_parse(const char *text, union cfx_sockaddr *addr_p)
{
    char host[256];
    const char *port;
    if (text == NULL || text[0] == '\0')
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV, "empty address; expected host:port");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host))
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV,
                                 "address \"%s\" is not [ipv6]:port", text);
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (colon == NULL || (size_t)(colon - text) >= sizeof(host))
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV, "address \"%s\" is not host:port",
                                 text);
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    char *end = NULL;
    long port_no = strtol(port, &end, 10);
    if (end == port || *end != '\0' || port_no < 0 || port_no > 65535)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV,
                             "address \"%s\": \"%s\" is not a port number", text, port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo(host, port, &hints, &found);
    if (rc != 0 || found == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV,
                             "address \"%s\": cannot resolve \"%s\": %s", text, host,
                             gai_strerror(rc));
    union cfx_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, found->ai_addr,
           found->ai_addrlen < sizeof(addr) ? found->ai_addrlen : sizeof(addr));
    freeaddrinfo(found);
    *addr_p = addr;
    return cfxSuccess;
}

int cfx_socket_ifname_matches(const char *filter, const char *ifname)
{
    if (filter == NULL || filter[0] == '\0')
        return 1;
    int exclude = filter[0] == '^';
    filter += exclude;
    int exact = filter[0] == '=';
    filter += exact;
    int hit = 0;
    char list[256];
    snprintf(list, sizeof(list), "%s", filter);
    char *save = NULL;
    for (char *word = strtok_r(list, ",", &save); word && !hit; word = strtok_r(NULL, ",", &save))
        hit = exact ? strcmp(ifname, word) == 0 : strncmp(ifname, word, strlen(word)) == 0;
    return exclude ? !hit : hit;
}

/* First up interface with an address of the wanted family passing the filter. */
static int pick_from(struct ifaddrs *list, const char *filter, int want_loopback, int family,
                     union cfx_sockaddr *addr_p, char *ifname, size_t ifname_size)
{
    for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP))
            continue;
        int fam = ifa->ifa_addr->sa_family;
        if (fam != AF_INET && fam != AF_INET6)
            continue;
        if (family && fam != family)
            continue;
        if (fam == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)(void *)ifa->ifa_addr)->sin6_addr))
            continue;
        int loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        if (filter == NULL && loopback != want_loopback)
            continue;
        if (filter && !cfx_socket_ifname_matches(filter, ifa->ifa_name))
            continue;
        if (filter == NULL && strncmp(ifa->ifa_name, "docker", 6) == 0)
            continue;
        memset(addr_p, 0, sizeof(*addr_p));
        memcpy(addr_p, ifa->ifa_addr,
               fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
        snprintf(ifname, ifname_size, "%s", ifa->ifa_name);
        return 1;
    }
    return 0;
}

cfxResult_t cfx_socket_pick_address(union cfx_sockaddr *addr_p, char *ifname, size_t ifname_size)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0)
        return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP, "cannot list network interfaces");
    const char *filter = param_socket_ifname();
    int64_t fam_param = param_socket_family();
    int family = fam_param == 4 ? AF_INET : fam_param == 6 ? AF_INET6 : 0;
    union cfx_sockaddr addr;
    char name[IF_NAMESIZE] = "";
    int found;
    if (filter) {
        /* IPv4 first, then anything. */
        found = pick_from(list, filter, 0, family ? family : AF_INET, &addr, name, sizeof(name)) ||
                pick_from(list, filter, 0, family, &addr, name, sizeof(name));
    } else {
        found = pick_from(list, NULL, 0, family ? family : AF_INET, &addr, name, sizeof(name)) ||
                pick_from(list, NULL, 0, family, &addr, name, sizeof(name)) ||
                pick_from(list, NULL, 1, family ? family : AF_INET, &addr, name, sizeof(name)) ||
                pick_from(list, NULL, 1, family, &addr, name, sizeof(name));
    }
    freeifaddrs(list);
    if (!found)
        return cfx_error_set(
            cfxSystemError, CFX_LOG_BOOTSTRAP,
            "no network interface matches CFX_SOCKET_IFNAME=\"%s\"; "
            "list interfaces with `ip addr` and set CFX_SOCKET_IFNAME to one of them",
            filter ? filter : "(default)");
    if (addr.sa.sa_family == AF_INET)
        addr.sin.sin_port = 0;
    else
        addr.sin6.sin6_port = 0;
    *addr_p = addr;
    snprintf(ifname, ifname_size, "%s", name);
    return cfxSuccess;
}

cfxResult_t cfx_socket_listen(const union cfx_sockaddr *addr, int *fd_p,
                              union cfx_sockaddr *bound_p)
{
    char where[80];
    cfx_socket_addr_format(addr, where, sizeof(where));
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP, "socket() for %s failed", where);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    union cfx_sockaddr bound;
    socklen_t len = sizeof(bound);
    if (bind(fd, &addr->sa, cfx_socket_addr_len(addr)) != 0) {
        int err = errno;
        close(fd);
        cfxResult_t res =
            cfx_error_set_errno(err, CFX_LOG_BOOTSTRAP, "cannot bind a listener to %s", where);
        errno = err; /* The caller may tell a port in use from the rest. */
        return res;
    }
    if (listen(fd, 1024) != 0 || getsockname(fd, &bound.sa, &len) != 0) {
        int err = errno;
        close(fd);
        return cfx_error_set_errno(err, CFX_LOG_BOOTSTRAP, "cannot listen on %s", where);
    }
    *fd_p = fd;
    *bound_p = bound;
    return cfxSuccess;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

cfxResult_t cfx_socket_connect(const union cfx_sockaddr *addr, int64_t deadline_ns,
                               const int *abort_flag, int *fd_p)
{
    char where[80];
    cfx_socket_addr_format(addr, where, sizeof(where));
    int backoff_ms = 1;
    for (;;) {
        if (aborted(abort_flag))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP, "connect to %s aborted", where);
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP, "socket() for %s failed", where);
        int err = 0;
        if (connect(fd, &addr->sa, cfx_socket_addr_len(addr)) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                err = ETIMEDOUT;
                while (cfx_time_now_ns() < deadline_ns && !aborted(abort_flag)) {
                    int n = poll(&pfd, 1, cfx_time_left_ms(deadline_ns, POLL_SLICE_MS));
                    if (n > 0) {
                        socklen_t len = sizeof(err);
                        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                        break;
                    }
                }
            }
        }
        if (err == 0) {
            tune(fd);
            *fd_p = fd;
            return cfxSuccess;
        }
        close(fd);
        int retry = err == ECONNREFUSED || err == ECONNRESET || err == EAGAIN || err == EINTR;
        if (!retry && err != ETIMEDOUT)
            return cfx_error_set_errno(err, CFX_LOG_BOOTSTRAP, "cannot connect to %s", where);
        if (cfx_time_now_ns() >= deadline_ns)
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "nobody accepted a connection at %s before the deadline; "
                                 "check that the root rank is running and reachable",
                                 where);
        poll(NULL, 0, cfx_time_left_ms(deadline_ns, backoff_ms));
        if (backoff_ms < 100)
            backoff_ms *= 2;
    }
}

cfxResult_t cfx_socket_accept(int listen_fd, int64_t deadline_ns, const int *abort_flag, int *fd_p)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            tune(fd);
            *fd_p = fd;
            return cfxSuccess;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP, "accept() failed");
        if (aborted(abort_flag))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP, "accept aborted");
        if (cfx_time_now_ns() >= deadline_ns)
            return cfxTimeout; /* The caller knows whom it waited for. */
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        poll(&pfd, 1, cfx_time_left_ms(deadline_ns, POLL_SLICE_MS));
    }
}

/* Shared loop of send_all/recv_all. */
static cfxResult_t transfer_all(int fd, char *buf, size_t size, int64_t deadline_ns,
                                const int *abort_flag, const char *peer, int sending)
{
    size_t done = 0;
    while (done < size) {
        ssize_t n = sending ? send(fd, buf + done, size - done, MSG_NOSIGNAL)
                            : recv(fd, buf + done, size - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                                 "%s closed the connection after %zu of %zu bytes", peer, done,
                                 size);
        if (errno == ECONNRESET || errno == EPIPE)
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                                 "%s reset the connection (%s) after %zu of %zu bytes", peer,
                                 sending ? "send" : "recv", done, size);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP, "%s to %s failed",
                                       sending ? "send" : "recv", peer);
        if (aborted(abort_flag))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP, "%s with %s aborted",
                                 sending ? "send" : "recv", peer);
        if (cfx_time_now_ns() >= deadline_ns)
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "%s with %s timed out after %zu of %zu bytes",
                                 sending ? "send" : "recv", peer, done, size);
        struct pollfd pfd = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        poll(&pfd, 1, cfx_time_left_ms(deadline_ns, POLL_SLICE_MS));
    }
    return cfxSuccess;
}

cfxResult_t cfx_socket_send_all(int fd, const void *buf, size_t size, int64_t deadline_ns,
                                const int *abort_flag, const char *peer)
{
    return transfer_all(fd, (char *)buf, size, deadline_ns, abort_flag, peer, 1);
}

cfxResult_t cfx_socket_recv_all(int fd, void *buf, size_t size, int64_t deadline_ns,
                                const int *abort_flag, const char *peer)
{
    return transfer_all(fd, buf, size, deadline_ns, abort_flag, peer, 0);
}

void cfx_socket_close(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}
