/*
 * libibverbs loaded at run time. libconflux does not link libibverbs: the
 * first caller of cfx_verbs_api() dlopens CFX_IB_VERBS_LIB (default
 * "libibverbs.so.1") and resolves each symbol at the version this table was
 * written for (IBVERBS_1.1, the version rdma-core has exported since 2007;
 * the optional ones at theirs), so one build runs on hosts with and without
 * rdma-core, and a test library with the same versioned symbols can stand in
 * for it. Only the plain RC subset is here: the data-path calls
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq) are inline functions of
 * <infiniband/verbs.h> that go through the context's ops and need no symbol.
 *
 * Built only when the verbs headers were found (CFX_HAVE_VERBS); without them
 * cfx_verbs_api() always answers NULL with a reason.
 */
#ifndef CFX_UTIL_VERBS_H
#define CFX_UTIL_VERBS_H

#include <stddef.h>
#include <stdint.h>

#include "cfx_build_config.h"

#if CFX_HAVE_VERBS
#include <infiniband/verbs.h>

/* The functions Conflux calls, each with the signature of the symbol version
 * named in verbs.c. Append only. */
struct cfx_verbs_api {
    /* Devices. */
    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *device_attr);
    int (*query_port)(struct ibv_context *context, uint8_t port_num,
                      struct ibv_port_attr *port_attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
    /* Resources. */
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    /* Failures. */
    int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
    void (*ack_async_event)(struct ibv_async_event *event);
    const char *(*wc_status_str)(enum ibv_wc_status status);
    const char *(*event_type_str)(enum ibv_event_type event);
    /* Optional (NULL when the library is older): dma-buf registration for
     * GPUDirect RDMA without nvidia-peermem (IBVERBS_1.12, rdma-core 34). */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
                                    uint64_t iova, int fd, int access);
};
#else
struct cfx_verbs_api; /* Never defined: no verbs headers at build time. */
#endif

/* The loaded table, or NULL when verbs cannot be used here; then, when
 * @p why_p is not NULL, *why_p says why in a sentence (library missing, a
 * required symbol missing at its version, built without verbs headers).
 * Loads once per process, thread-safe; the first failure is logged at INFO
 * (subsystem NET). The library stays loaded until the process exits. */
const struct cfx_verbs_api *cfx_verbs_api(const char **why_p);

/* Forget the loaded library so the next call loads again (tests that point
 * CFX_IB_VERBS_LIB elsewhere). Not thread-safe; nothing may use the table. */
void cfx_verbs_api_reset(void);

/* Whether a GPU peer-memory client is loaded in this host's kernel
 * (nvidia-peermem, or Mellanox's older nv_peer_mem), so that ibv_reg_mr of
 * a device pointer registers GPU memory: one of its sysfs files exists. */
int cfx_verbs_peermem_loaded(void);

#endif /* CFX_UTIL_VERBS_H */
