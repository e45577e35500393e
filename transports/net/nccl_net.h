/*
 * The binary interface of NCCL network plugins, versions 8 to 11, as
 * Conflux sees it: the tables a plugin library exports (symbols
 * "ncclNetPlugin_v8" ... "ncclNetPlugin_v11"), their property records, the
 * result codes and the logger the plugin is handed. Written for Conflux;
 * only the layout is NCCL's, and it must stay exactly NCCL's (field order,
 * types, enum values): a plugin built against NCCL's own headers reads and
 * writes these very bytes. Checked against NVIDIA's nccl repository
 * (plugins/net/example/nccl and src/include/plugin/net: net_v8.h to
 * net_v11.h, net.h, err.h, common.h, net_device.h).
 *
 * What changed from v8 to v9:
 *   - the property record gained forceFlush (after regIsGlobal), vProps
 *     (a virtual NIC's member devices) and maxP2pBytes/maxCollBytes at the
 *     end;
 *   - isend takes its size as size_t (v8: int), irecv its sizes as size_t *
 *     (v8: int *); test still reports int sizes in both;
 *   - the table gained makeVDevice at the end.
 * From v9 to v10 (NCCL 2.23): init also takes a profiler callback; connect
 * takes a per-connection config (a traffic class) before the handle;
 * isend takes a profiler handle and irecv an array of them, both before
 * the request. The property record is v9's.
 * From v10 to v11 (NCCL 2.28): init makes a context (per communicator in
 * NCCL) from a communicator id and the config, and listen and connect take
 * that context first (connect's config moved to init); the property record
 * gained maxMultiRequestSize at the end; the table gained finalize(ctx) and
 * setNetAttr(ctx, attr) at the end.
 * Everything else (call order, the handle, the request semantics) is the
 * same. Nothing outside transports/net and its test plugin includes this.
 */
#ifndef CFX_TRANSPORTS_NET_NCCL_NET_H
#define CFX_TRANSPORTS_NET_NCCL_NET_H

#include <stddef.h>
#include <stdint.h>

/* Result of every plugin call (NCCL's ncclResult_t values). */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
} ncclResult_t;

/* Kinds of memory a device can move (ptrSupport bits, regMr's type). */
#define NCCL_PTR_HOST   0x1
#define NCCL_PTR_CUDA   0x2
#define NCCL_PTR_DMABUF 0x4

/* Bytes of the handle listen() fills and connect() reads. */
#define NCCL_NET_HANDLE_MAXSIZE 128
/* Requests a caller keeps outstanding per comm at most (v8's limit). */
#define NCCL_NET_MAX_REQUESTS_V8 8
/* Devices one virtual NIC may group (v9). */
#define NCCL_NET_MAX_DEVS_PER_NIC_V9 4

/* The logger handed to init(): level, subsystem bits, source position,
 * then a printf format and its arguments. */
typedef enum {
    NCCL_LOG_NONE = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN = 2,
    NCCL_LOG_INFO = 3,
    NCCL_LOG_ABORT = 4,
    NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;
#define NCCL_LOG_SUBSYS_NET 16 /* NCCL_NET among the subsystem bits. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);

/* Network offload ("device networking"): Conflux asks for none. */
typedef enum {
    NCCL_NET_DEVICE_HOST = 0,
    NCCL_NET_DEVICE_UNPACK = 1,
} ncclNetDeviceType;

/* What connect()/accept() may return for an offloaded connection; the
 * same record in v8 to v11. Conflux passes a pointer to a NULL pointer:
 * no offload asked. */
typedef struct {
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;

/* ------------------------------------------------------------ version 8 */

typedef struct {
    char *name;     /* For logs. */
    char *pciPath;  /* The device's directory in /sys. */
    uint64_t guid;  /* Identifies the NIC chip across PCI functions. */
    int ptrSupport; /* NCCL_PTR_* bits. */
    int regIsGlobal;
    int speed; /* Mbps. */
    int port;
    float latency;
    int maxComms;
    int maxRecvs; /* Receives one irecv may group. */
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v8_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v8_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

/* ------------------------------------------------------------ version 9 */

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush; /* New in v9. */
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v9_t vProps; /* New in v9. */
    size_t maxP2pBytes;              /* New in v9. */
    size_t maxCollBytes;             /* New in v9. */
} ncclNetProperties_v9_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v9_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v9_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props); /* New in v9. */
} ncclNet_v9_t;

/* ----------------------------------------------------------- version 10 */

/* What a plugin's profiler hooks call back (NCCL's profiler); Conflux has
 * no profiler plugin and passes NULL. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
                                               int64_t pluginId, void *extData);

#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1) /* The plugin's default traffic class. */
typedef struct {
    int trafficClass; /* Plugin-specific; NCCL_NET_TRAFFIC_CLASS_UNDEF: its default. */
} ncclNetCommConfig_v10_t;

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t; /* Unchanged from v9. */
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v10_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v10_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v10_t *props);
} ncclNet_v10_t;

/* ----------------------------------------------------------- version 11 */

typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v11_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize; /* New in v11. */
} ncclNetProperties_v11_t;

/* setNetAttr's hints (v11); Conflux never calls it. */
typedef struct {
    int32_t maxConcurrentPeers;
    int32_t minConcurrentPeers;
    int32_t maxFlowsPerPeer;
    int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
    ncclNetCommAttr_v11_t sendCommAttr;
    ncclNetCommAttr_v11_t recvCommAttr;
    uint32_t op;
    uint32_t algo;
    uint32_t proto;
} ncclNetAttr_v11_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
                         ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
    ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v11_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v11_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v11_t *props);
    ncclResult_t (*finalize)(void *ctx);                               /* New in v11. */
    ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v11_t *netAttr); /* New in v11. */
} ncclNet_v11_t;

/* The layout on LP64 targets, as NCCL's own headers give it (compared
 * field by field against them when this file was written): a changed field
 * here breaks every plugin. */
#if defined(__LP64__)
_Static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "v8 properties layout");
_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 properties layout");
_Static_assert(offsetof(ncclNetProperties_v9_t, speed) == 36, "v9 properties layout");
_Static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 properties layout");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxCollBytes) == 96, "v9 properties layout");
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 properties layout");
_Static_assert(offsetof(ncclNet_v8_t, isend) == 80, "v8 table layout");
_Static_assert(sizeof(ncclNet_v8_t) == 152, "v8 table layout");
_Static_assert(offsetof(ncclNet_v9_t, test) == 104, "v9 table layout");
_Static_assert(sizeof(ncclNet_v9_t) == 160, "v9 table layout");
_Static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32, "device handle layout");
_Static_assert(offsetof(ncclNet_v10_t, isend) == 80, "v10 table layout");
_Static_assert(sizeof(ncclNet_v10_t) == 160, "v10 table layout");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 properties");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties layout");
_Static_assert(offsetof(ncclNet_v11_t, makeVDevice) == 152, "v11 table layout");
_Static_assert(sizeof(ncclNet_v11_t) == 176, "v11 table layout");
#endif

#endif /* CFX_TRANSPORTS_NET_NCCL_NET_H */
