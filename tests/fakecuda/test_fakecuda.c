/*
 * fake-cuda (tests/fakecuda) behaves like the CUDA driver where Conflux
 * depends on it: devices and contexts, memory and pointer attributes,
 * cuMem virtual memory and its export as file descriptors, bounds checks,
 * stream order (legacy against blocking and non-blocking
 * streams), host functions, events, kernels whose blocks wait on each
 * other, stream capture and its rules, graphs, the fork rule, the knobs,
 * and the exported names. Each test runs in its own process (Criterion),
 * so each calls cuInit itself after setting its knobs. The library is
 * linked (its names are <cuda.h>'s ABI names) and, for the export test,
 * also opened by path from FAKECUDA_LIB as Conflux opens it. Waits on the
 * fake's threads have deadlines: a broken ordering fails, it does not hang.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"

#define WAIT_MS   10000 /* longest wait on the fake's threads */
#define SETTLE_MS 50    /* time for work that must NOT run yet to show up */

static const char *err_name(CUresult err)
{
    const char *name = NULL;
    return cuGetErrorName(err, &name) == CUDA_SUCCESS ? name : "(unknown)";
}

#define CU_IS(call, want)                                                                          \
    do {                                                                                           \
        CUresult got_ = (call);                                                                    \
        cr_assert_eq(got_, (want), "%s -> %s, want %s", #call, err_name(got_), err_name(want));    \
    } while (0)
#define CU_OK(call) CU_IS(call, CUDA_SUCCESS)

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait until *value == want; 1, or 0 after WAIT_MS. */
static int wait_for(atomic_int *value, int want)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    while (atomic_load(value) != want) {
        if (now_ms() > deadline)
            return 0;
        sleep_ms(1);
    }
    return 1;
}

/* cuStreamQuery until the stream is idle; 1, or 0 after WAIT_MS. */
static int stream_done_soon(CUstream stream)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    while (cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
        if (now_ms() > deadline)
            return 0;
        sleep_ms(1);
    }
    return 1;
}

/* cuInit with @p n_devices, then device @p device's primary context current. */
static CUcontext init_on(int n_devices, int device)
{
    char count[16];
    snprintf(count, sizeof(count), "%d", n_devices);
    setenv("FAKECUDA_DEVICES", count, 1);
    CU_OK(cuInit(0));
    CUcontext ctx = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, device));
    CU_OK(cuCtxSetCurrent(ctx));
    return ctx;
}

static CUcontext init_one(void)
{
    return init_on(1, 0);
}

/* ------------------------------------------------------------ host steps */

/* What host functions append to, in the order they ran. */
struct order {
    atomic_int n;
    char seq[64];
};

/* One host function: wait for *gate (when set), then append @p tag. */
struct step {
    struct order *order;
    char tag;
    atomic_int *gate;
    pthread_t thread; /* the thread it ran on */
};

static void step_run(void *arg)
{
    struct step *step = arg;
    step->thread = pthread_self();
    uint64_t deadline = now_ms() + WAIT_MS;
    while (step->gate != NULL && !atomic_load(step->gate) && now_ms() < deadline)
        sleep_ms(1);
    int i = atomic_fetch_add(&step->order->n, 1);
    if (i < (int)sizeof(step->order->seq) - 1)
        step->order->seq[i] = step->tag;
}

static void order_is(struct order *order, const char *want)
{
    cr_assert(wait_for(&order->n, (int)strlen(want)), "ran \"%s\", want \"%s\"", order->seq, want);
    cr_assert_str_eq(order->seq, want);
}

static void count_up(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
}

/* ------------------------------------------------------------ kernels */

static CUfunction kernel(const char *name)
{
    static const unsigned char fatbin[16] = {0x50, 0xED, 0x55, 0xBA, 1, 0, 16, 0};
    CUmodule module = NULL;
    CU_OK(cuModuleLoadData(&module, fatbin));
    CUfunction fn = NULL;
    CU_OK(cuModuleGetFunction(&fn, module, name));
    return fn;
}

static CUresult launch(CUfunction fn, unsigned blocks, CUstream stream, void *params)
{
    void *args[] = {params};
    return cuLaunchKernel(fn, blocks, 1, 1, 128, 1, 1, 0, stream, args, NULL);
}

/* Most tests hold streams with host functions that wait for a gate, and
 * read what a synchronous set or copy wrote at once: they run with host
 * functions of different streams at once and nothing landing late. The
 * tests of those two CUDA behaviours (the fake's defaults) unset these. */
static void suite_init(void)
{
    setenv("FAKECUDA_HOST_FN_SERIAL", "0", 1);
    setenv("FAKECUDA_LAZY_US", "0", 1);
}

static void cuda_defaults(void)
{
    unsetenv("FAKECUDA_HOST_FN_SERIAL");
    unsetenv("FAKECUDA_LAZY_US");
}

TestSuite(fakecuda, .timeout = 60, .init = suite_init);

/* ------------------------------------------------------------ init, devices */

Test(fakecuda, calls_before_cuinit_are_not_initialized)
{
    int n = 0;
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    CU_IS(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CU_IS(cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
    CU_IS(cuMemAlloc(&ptr, 16), CUDA_ERROR_NOT_INITIALIZED);
    CU_IS(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    int version = 0;
    CU_OK(cuDriverGetVersion(&version)); /* answered without cuInit */
    cr_assert_eq(version, 13000);
}

Test(fakecuda, no_device_knob_fails_cuinit_with_no_device)
{
    setenv("FAKECUDA_NO_DEVICE", "1", 1);
    CU_IS(cuInit(0), CUDA_ERROR_NO_DEVICE);
    int n = 0;
    CU_IS(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    const char *text = NULL;
    CU_OK(cuGetErrorString(CUDA_ERROR_NO_DEVICE, &text));
    cr_assert_str_eq(text, "no CUDA-capable device is detected");
    cr_assert_str_eq(err_name(CUDA_ERROR_NO_DEVICE), "CUDA_ERROR_NO_DEVICE");
}

Test(fakecuda, devices_knob_gives_that_many_h200_like_devices)
{
    setenv("FAKECUDA_DEVICES", "4", 1);
    CU_OK(cuInit(0));
    int n = 0;
    CU_OK(cuDeviceGetCount(&n));
    cr_assert_eq(n, 4);
    static const struct {
        CUdevice_attribute attr;
        int value; /* -1: 0x10 + ordinal */
    } expect[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
        {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
        {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
        {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
        {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, -1},
        {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    };
    for (int ordinal = 0; ordinal < n; ordinal++) {
        CUdevice dev = -1;
        CU_OK(cuDeviceGet(&dev, ordinal));
        for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
            int value = -2;
            CU_OK(cuDeviceGetAttribute(&value, expect[i].attr, dev));
            cr_assert_eq(value, expect[i].value >= 0 ? expect[i].value : 0x10 + ordinal,
                         "attribute %d of device %d", (int)expect[i].attr, ordinal);
        }
        char name[64], bus_id[32], want_bus[32];
        CU_OK(cuDeviceGetName(name, sizeof(name), dev));
        cr_assert_str_eq(name, "Fake H200 (fakecuda)");
        CU_OK(cuDeviceGetPCIBusId(bus_id, sizeof(bus_id), dev));
        snprintf(want_bus, sizeof(want_bus), "0000:1%X:00.0", ordinal);
        cr_assert_str_eq(bus_id, want_bus);
        size_t bytes = 0;
        CU_OK(cuDeviceTotalMem(&bytes, dev));
        cr_assert_eq(bytes, (size_t)80 << 30);
    }
}

Test(fakecuda, bad_ordinals_and_attributes_are_refused)
{
    CU_OK(cuInit(0));
    CUdevice dev = 0;
    int value = 0;
    CUcontext ctx = NULL;
    CU_IS(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
    CU_IS(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    CU_IS(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7),
          CUDA_ERROR_INVALID_DEVICE);
    CU_IS(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuDevicePrimaryCtxRetain(&ctx, 3), CUDA_ERROR_INVALID_DEVICE);
    CU_IS(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT); /* never retained */
    CU_IS(cuCtxSetCurrent((CUcontext)&value), CUDA_ERROR_INVALID_CONTEXT);
}

Test(fakecuda, peer_access_between_two_devices_is_enabled_once)
{
    CUcontext ctx0 = init_on(2, 0);
    CUcontext ctx1 = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
    int can = -1;
    CU_OK(cuDeviceCanAccessPeer(&can, 0, 1));
    cr_assert_eq(can, 1);
    CU_OK(cuDeviceCanAccessPeer(&can, 1, 1));
    cr_assert_eq(can, 0, "a device is not its own peer");
    CU_OK(cuCtxEnablePeerAccess(ctx1, 0));
    CU_IS(cuCtxEnablePeerAccess(ctx1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CU_IS(cuCtxEnablePeerAccess(ctx0, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuCtxEnablePeerAccess(ctx1, 1), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, no_peer_knob_denies_peer_access)
{
    setenv("FAKECUDA_NO_PEER", "1", 1);
    init_on(2, 0);
    CUcontext ctx1 = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
    int can = -1;
    CU_OK(cuDeviceCanAccessPeer(&can, 0, 1));
    cr_assert_eq(can, 0);
    CU_IS(cuCtxEnablePeerAccess(ctx1, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
}

Test(fakecuda, every_code_has_a_name_and_a_string_and_unknown_codes_have_neither)
{
    static const CUresult returned[] = {
        CUDA_SUCCESS,
        CUDA_ERROR_INVALID_VALUE,
        CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_NO_DEVICE,
        CUDA_ERROR_INVALID_DEVICE,
        CUDA_ERROR_INVALID_IMAGE,
        CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_ILLEGAL_STATE,
        CUDA_ERROR_NOT_FOUND,
        CUDA_ERROR_NOT_READY,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_NOT_PERMITTED,
        CUDA_ERROR_NOT_SUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        CUDA_ERROR_STREAM_CAPTURE_MERGE,
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        CUDA_ERROR_CAPTURED_EVENT,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        CUDA_ERROR_UNKNOWN,
    };
    for (size_t i = 0; i < sizeof(returned) / sizeof(returned[0]); i++) {
        const char *name = NULL, *text = NULL;
        CU_OK(cuGetErrorName(returned[i], &name));
        CU_OK(cuGetErrorString(returned[i], &text));
        cr_assert(name != NULL && strncmp(name, "CUDA_", 5) == 0, "code %d", (int)returned[i]);
        cr_assert(text != NULL && text[0] != '\0', "code %d", (int)returned[i]);
    }
    const char *text = "unset";
    CU_IS(cuGetErrorString((CUresult)12345, &text), CUDA_ERROR_INVALID_VALUE);
    cr_assert_null(text);
    CU_IS(cuGetErrorName((CUresult)12345, &text), CUDA_ERROR_INVALID_VALUE);
    cr_assert_null(text);
}

/* ------------------------------------------------------------ contexts */

struct new_thread_view {
    CUresult get_current;
    CUcontext current;
    CUresult get_device;
};

static void *view_of_new_thread(void *arg)
{
    struct new_thread_view *view = arg;
    CUdevice dev;
    view->get_current = cuCtxGetCurrent(&view->current);
    view->get_device = cuCtxGetDevice(&dev);
    return NULL;
}

Test(fakecuda, the_current_context_is_per_thread)
{
    CUcontext ctx = init_one();
    struct new_thread_view view = {CUDA_ERROR_UNKNOWN, ctx, CUDA_ERROR_UNKNOWN};
    pthread_t thread;
    pthread_create(&thread, NULL, view_of_new_thread, &view);
    pthread_join(thread, NULL);
    cr_assert_eq(view.get_current, CUDA_SUCCESS);
    cr_assert_null(view.current, "a new thread has no current context");
    cr_assert_eq(view.get_device, CUDA_ERROR_INVALID_CONTEXT);
    CUcontext current = NULL;
    CU_OK(cuCtxGetCurrent(&current));
    cr_assert_eq(current, ctx);
    CUdevice dev = -1;
    CU_OK(cuCtxGetDevice(&dev));
    cr_assert_eq(dev, 0);
}

Test(fakecuda, calls_that_need_a_context_fail_without_one)
{
    static const unsigned char fatbin[8] = {0x50, 0xED, 0x55, 0xBA};
    CU_OK(cuInit(0));
    CUdeviceptr dptr = 0;
    void *host = NULL;
    CUstream stream = NULL;
    CUevent event = NULL;
    CUmodule module = NULL;
    CUdevice dev = 0;
    struct order order = {0};
    struct step step = {&order, 'A', NULL, 0};
    CU_IS(cuMemAlloc(&dptr, 64), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuMemHostAlloc(&host, 64, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuStreamCreate(&stream, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuEventCreate(&event, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuModuleLoadData(&module, fatbin), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuLaunchHostFunc(NULL, step_run, &step), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
}

Test(fakecuda, primary_context_is_refcounted_and_its_last_release_resets_it)
{
    CUcontext ctx = init_one();
    CUcontext again = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
    cr_assert_eq(again, ctx);
    CUdeviceptr dptr = 0;
    CU_OK(cuMemAlloc(&dptr, 64));
    unsigned int type = 0;
    CU_OK(cuDevicePrimaryCtxRelease(0));
    CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr));
    CU_OK(cuDevicePrimaryCtxRelease(0)); /* the last: reset */
    CU_IS(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemAlloc(&dptr, 64), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
    cr_assert_eq(again, ctx, "the handle stays");
    CU_OK(cuMemAlloc(&dptr, 64));
}

/* ------------------------------------------------------------ memory */

Test(fakecuda, device_memory_is_256_aligned_and_typed_device_anywhere_inside)
{
    CUcontext ctx = init_on(2, 1);
    CUdeviceptr dptr = 0;
    CU_OK(cuMemAlloc(&dptr, 1000));
    cr_assert_eq(dptr % 256, 0);
    unsigned int type = 0, managed = 7;
    int ordinal = -1;
    CUdeviceptr dev_ptr = 0;
    CUcontext owner = NULL;
    void *host_ptr = NULL;
    CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr + 999));
    cr_assert_eq(type, CU_MEMORYTYPE_DEVICE);
    CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr + 10));
    cr_assert_eq(ordinal, 1);
    CU_OK(cuPointerGetAttribute(&dev_ptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, dptr + 10));
    cr_assert_eq(dev_ptr, dptr + 10);
    CU_OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dptr));
    cr_assert_eq(managed, 0);
    CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, dptr));
    cr_assert_eq(owner, ctx);
    CU_IS(cuPointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, dptr),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr + 1000),
          CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, pinned_and_registered_memory_are_host_memory_at_the_same_address)
{
    init_one();
    char *pinned = NULL;
    CU_OK(cuMemHostAlloc((void **)&pinned, 100,
                         CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED));
    char *buffer = malloc(200);
    CU_OK(cuMemHostRegister(buffer + 3, 50, CU_MEMHOSTREGISTER_DEVICEMAP)); /* unaligned */
    char *const bases[] = {pinned, buffer + 3};
    for (int i = 0; i < 2; i++) {
        char *inside = bases[i] + 5;
        unsigned int type = 0;
        void *host_ptr = NULL;
        CUdeviceptr dev_ptr = 0, mapped = 0;
        CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)inside));
        cr_assert_eq(type, CU_MEMORYTYPE_HOST);
        CU_OK(cuPointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                    (CUdeviceptr)inside));
        cr_assert_eq(host_ptr, inside);
        CU_OK(cuPointerGetAttribute(&dev_ptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                    (CUdeviceptr)inside));
        cr_assert_eq(dev_ptr, (CUdeviceptr)inside);
        CU_OK(cuMemHostGetDevicePointer(&mapped, inside, 0));
        cr_assert_eq(mapped, (CUdeviceptr)inside);
    }
    CU_OK(cuMemHostUnregister(buffer + 3));
    CU_OK(cuMemFreeHost(pinned));
    free(buffer);
}

Test(fakecuda, unknown_pointers_have_no_attributes_and_no_device_pointer)
{
    init_one();
    int on_stack = 0;
    unsigned int type = 0;
    CUdeviceptr mapped = 0, dptr = 0;
    CU_IS(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)&on_stack),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemHostGetDevicePointer(&mapped, &on_stack, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAlloc(&dptr, 64));
    CU_IS(cuMemHostGetDevicePointer(&mapped, (void *)dptr, 0), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, host_register_refuses_overlaps_and_unregister_needs_a_registration)
{
    init_one();
    char *buffer = aligned_alloc(4096, 3 * 4096);
    void *pinned = NULL;
    CU_OK(cuMemHostAlloc(&pinned, 4096, 0));
    CU_OK(cuMemHostRegister(buffer, 4096, 0));
    CU_IS(cuMemHostRegister(buffer + 100, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CU_IS(cuMemHostRegister(buffer + 4000, 200, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CU_IS(cuMemHostRegister(pinned, 64, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CU_OK(cuMemHostRegister(buffer + 4096, 4096, 0)); /* adjacent */
    CU_IS(cuMemHostRegister(buffer + 2 * 4096, 64, 0x100), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemHostUnregister(buffer + 100), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CU_OK(cuMemHostUnregister(buffer));
    CU_IS(cuMemHostUnregister(buffer), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CU_OK(cuMemHostUnregister(buffer + 4096));
    free(buffer);
}

Test(fakecuda, copies_and_sets_are_bounds_checked_against_their_allocation)
{
    init_one();
    CUdeviceptr a = 0, b = 0;
    CU_OK(cuMemAlloc(&a, 4096));
    CU_OK(cuMemAlloc(&b, 4096));
    char host[8192] = {0};
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemcpyHtoD(a, host, 4096));
    CU_IS(cuMemcpyHtoD(a + 1, host, 4096), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemcpyHtoD((CUdeviceptr)host, host + 4096, 16), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemcpyDtoH(host, a + 4000, 97), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemsetD8(a + 4095, 0, 2), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemsetD8((CUdeviceptr)host, 0, 2), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemcpyHtoDAsync(a + 1, host, 4096, stream), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemcpyDtoHAsync(host, b + 1, 4096, stream), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemcpyAsync(a, b + 1, 4096, stream), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemsetD8Async(a, 1, 4097, stream), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemcpyAsync(a, b, 4096, stream));
    CU_OK(cuStreamSynchronize(stream));
}

Test(fakecuda, synchronous_and_asynchronous_copies_and_sets_move_the_bytes)
{
    init_one();
    CUdeviceptr a = 0, b = 0;
    CU_OK(cuMemAlloc(&a, 256));
    CU_OK(cuMemAlloc(&b, 256));
    unsigned char in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)i;
    CU_OK(cuMemcpyHtoD(a, in, 256));
    CU_OK(cuMemsetD8(a + 16, 0xAB, 16));
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuMemcpyAsync(b, a, 256, stream));
    CU_OK(cuMemsetD8Async(b, 0xCD, 4, stream));
    CU_OK(cuMemcpyDtoHAsync(out, b, 256, stream));
    CU_OK(cuStreamSynchronize(stream));
    for (int i = 0; i < 256; i++) {
        int want = i < 4 ? 0xCD : i >= 16 && i < 32 ? 0xAB : i;
        cr_assert_eq(out[i], want, "byte %d", i);
    }
}

/* cuMemsetD8 of device memory and cuMemcpyHtoD from pageable memory return
 * before they land, on the legacy stream: a non-blocking stream does not
 * see them yet (an H200 showed it), the legacy stream's sync does. */
Test(fakecuda, a_device_memset_and_a_pageable_htod_land_late_on_the_legacy_stream)
{
    cuda_defaults();
    setenv("FAKECUDA_LAZY_US", "300000", 1); /* Late enough to see on a loaded machine. */
    init_one();
    CUdeviceptr a = 0, b = 0;
    CU_OK(cuMemAlloc(&a, 256));
    CU_OK(cuMemAlloc(&b, 256));
    CU_OK(cuMemsetD8Async(a, 0x11, 256, NULL));
    CU_OK(cuMemsetD8Async(b, 0x11, 256, NULL));
    CU_OK(cuStreamSynchronize(NULL));
    CUstream free_running = NULL;
    CU_OK(cuStreamCreate(&free_running, CU_STREAM_NON_BLOCKING));
    unsigned char in[256], out[256];
    memset(in, 0x22, sizeof(in));
    uint64_t start = now_ms();
    CU_OK(cuMemsetD8(a, 0xAB, 256));
    CU_OK(cuMemcpyHtoD(b, in, 256));
    memset(in, 0x33, sizeof(in)); /* The staged copy keeps what it saw. */
    cr_assert_lt(now_ms() - start, 250, "the set and the copy waited to land");
    CU_OK(cuMemcpyDtoHAsync(out, a, 256, free_running));
    CU_OK(cuStreamSynchronize(free_running));
    cr_assert_eq(out[0], 0x11, "the set landed before a non-blocking stream read it");
    CU_OK(cuStreamSynchronize(NULL));
    CU_OK(cuMemcpyDtoHAsync(out, a, 256, free_running));
    CU_OK(cuStreamSynchronize(free_running));
    cr_assert(out[0] == 0xAB && out[255] == 0xAB, "after the legacy sync: %#x", out[0]);
    CU_OK(cuMemcpyDtoHAsync(out, b, 256, free_running));
    CU_OK(cuStreamSynchronize(free_running));
    cr_assert(out[0] == 0x22 && out[255] == 0x22, "the pageable copy: %#x", out[0]);
}

/* CUDA may run the host functions of independent streams on one thread,
 * one after the other: the fake always does. */
Test(fakecuda, host_functions_of_two_streams_run_one_at_a_time)
{
    cuda_defaults();
    init_one();
    CUstream s1 = NULL, s2 = NULL;
    CU_OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(s1, step_run, &a));
    sleep_ms(SETTLE_MS); /* A holds the host functions' turn. */
    CU_OK(cuLaunchHostFunc(s2, step_run, &b));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0, "B ran while A's host function waited");
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(s1));
    CU_OK(cuStreamSynchronize(s2));
    order_is(&order, "AB");
}

/* cuStreamWaitValue32: the stream waits until a word of pinned (or device)
 * memory meets the condition; GEQ is cyclic. */
Test(fakecuda, a_stream_waits_for_a_word_in_pinned_memory)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    uint32_t *word = NULL;
    CU_OK(cuMemHostAlloc((void **)&word, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr dev = 0;
    CU_OK(cuMemHostGetDevicePointer(&dev, word, 0));
    *word = 0xFFFFFFF0u;
    atomic_int ran = 0;
    CU_OK(cuStreamWaitValue32(stream, dev, 0x10, CU_STREAM_WAIT_VALUE_GEQ));
    CU_OK(cuLaunchHostFunc(stream, count_up, &ran));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&ran), 0, "0xfffffff0 is before 0x10, cyclically");
    __atomic_store_n(word, 0x0Fu, __ATOMIC_RELEASE);
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&ran), 0);
    __atomic_store_n(word, 0x11u, __ATOMIC_RELEASE);
    cr_assert(wait_for(&ran, 1), "the stream never went on");
    CU_OK(cuStreamWaitValue32(stream, dev, 0x11, CU_STREAM_WAIT_VALUE_EQ));
    CU_OK(cuStreamSynchronize(stream));
    char pageable[64];
    CU_IS(cuStreamWaitValue32(stream, (CUdeviceptr)(uintptr_t)pageable, 1, 0),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuStreamWaitValue32(stream, dev + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFreeHost(word));
}

Test(fakecuda, free_needs_the_base_of_an_allocation_of_its_kind)
{
    init_one();
    CUdeviceptr dptr = 0;
    void *pinned = NULL;
    CU_OK(cuMemAlloc(&dptr, 1024));
    CU_OK(cuMemHostAlloc(&pinned, 1024, 0));
    CU_IS(cuMemFree(dptr + 256), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemFree((CUdeviceptr)pinned), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemFreeHost((void *)dptr), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFree(dptr));
    CU_IS(cuMemFree(dptr), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFreeHost(pinned));
}

/* ------------------------------------------------------------ streams */

Test(fakecuda, legacy_stream_work_waits_for_earlier_blocking_stream_work)
{
    init_one();
    CUstream blocking = NULL;
    CU_OK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(blocking, step_run, &a));
    CU_OK(cuLaunchHostFunc(NULL, step_run, &b));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0, "legacy work ran before the blocking stream's");
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(NULL));
    order_is(&order, "AB");
}

Test(fakecuda, blocking_stream_work_waits_for_earlier_legacy_work)
{
    init_one();
    CUstream blocking = NULL;
    CU_OK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(CU_STREAM_LEGACY, step_run, &a));
    CU_OK(cuLaunchHostFunc(blocking, step_run, &b));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0, "blocking-stream work ran before the legacy work");
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(blocking));
    order_is(&order, "AB");
}

Test(fakecuda, non_blocking_streams_and_the_legacy_stream_never_wait_for_each_other)
{
    init_one();
    CUstream free_running = NULL;
    CU_OK(cuStreamCreate(&free_running, CU_STREAM_NON_BLOCKING));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    struct step c = {&order, 'C', &gate, 0}, d = {&order, 'D', NULL, 0};
    CU_OK(cuLaunchHostFunc(free_running, step_run, &a));
    CU_OK(cuLaunchHostFunc(NULL, step_run, &b)); /* runs while A waits */
    order_is(&order, "B");
    CU_OK(cuLaunchHostFunc(NULL, step_run, &c));
    CU_OK(cuLaunchHostFunc(free_running, step_run, &d)); /* after A, not after C */
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 1);
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(free_running));
    CU_OK(cuStreamSynchronize(NULL));
    cr_assert_eq(atomic_load(&order.n), 4);
    cr_assert(order.seq[0] == 'B' && strchr(order.seq, 'D') > strchr(order.seq, 'A'), "ran %s",
              order.seq);
}

Test(fakecuda, the_per_thread_stream_is_blocking_with_respect_to_legacy)
{
    init_one();
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(CU_STREAM_PER_THREAD, step_run, &a));
    CU_OK(cuLaunchHostFunc(CU_STREAM_LEGACY, step_run, &b));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0);
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(CU_STREAM_LEGACY));
    order_is(&order, "AB");
}

Test(fakecuda, host_functions_run_in_order_on_a_thread_that_is_not_the_callers)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    struct order order = {0};
    struct step steps[10];
    for (int i = 0; i < 10; i++) {
        steps[i] = (struct step){&order, (char)('0' + i), NULL, 0};
        CU_OK(cuLaunchHostFunc(stream, step_run, &steps[i]));
    }
    CU_OK(cuStreamSynchronize(stream));
    order_is(&order, "0123456789");
    for (int i = 0; i < 10; i++)
        cr_assert(!pthread_equal(steps[i].thread, pthread_self()));
}

struct calls_inside {
    CUresult query, alloc, current, init, name;
};

static void cuda_calls_from_host_function(void *arg)
{
    struct calls_inside *calls = arg;
    CUdeviceptr dptr;
    CUcontext ctx;
    const char *name;
    calls->query = cuStreamQuery(NULL);
    calls->alloc = cuMemAlloc(&dptr, 16);
    calls->current = cuCtxGetCurrent(&ctx);
    calls->init = cuInit(0);
    calls->name = cuGetErrorName(CUDA_ERROR_NOT_PERMITTED, &name);
}

Test(fakecuda, cuda_calls_inside_a_host_function_are_not_permitted)
{
    init_one();
    struct calls_inside calls = {0};
    CU_OK(cuLaunchHostFunc(NULL, cuda_calls_from_host_function, &calls));
    CU_OK(cuStreamSynchronize(NULL));
    cr_assert_eq(calls.query, CUDA_ERROR_NOT_PERMITTED);
    cr_assert_eq(calls.alloc, CUDA_ERROR_NOT_PERMITTED);
    cr_assert_eq(calls.current, CUDA_ERROR_NOT_PERMITTED);
    cr_assert_eq(calls.init, CUDA_ERROR_NOT_PERMITTED);
    cr_assert_eq(calls.name, CUDA_SUCCESS, "error strings are not CUDA work");
}

Test(fakecuda, stream_query_is_not_ready_while_work_is_pending)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuStreamQuery(stream));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0};
    CU_OK(cuLaunchHostFunc(stream, step_run, &a));
    CU_IS(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
    CU_IS(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY); /* legacy covers blocking streams */
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(stream));
    CU_OK(cuStreamQuery(stream));
}

Test(fakecuda, destroying_a_stream_lets_its_pending_work_run)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(stream, step_run, &a));
    CU_OK(cuLaunchHostFunc(stream, step_run, &b));
    CU_OK(cuStreamDestroy(stream));
    CU_IS(cuStreamQuery(stream), CUDA_ERROR_INVALID_HANDLE);
    CU_IS(cuStreamDestroy(stream), CUDA_ERROR_INVALID_HANDLE);
    atomic_store(&gate, 1);
    order_is(&order, "AB");
}

Test(fakecuda, stream_wait_event_orders_work_across_streams)
{
    init_one();
    CUstream first = NULL, second = NULL;
    CU_OK(cuStreamCreate(&first, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
    CUevent event = NULL;
    CU_OK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0}, b = {&order, 'B', NULL, 0};
    CU_OK(cuLaunchHostFunc(first, step_run, &a));
    CU_OK(cuEventRecord(event, first));
    CU_OK(cuStreamWaitEvent(second, event, 0));
    CU_OK(cuLaunchHostFunc(second, step_run, &b));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0);
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(second));
    order_is(&order, "AB");
}

/* ------------------------------------------------------------ events */

Test(fakecuda, a_never_recorded_event_is_complete)
{
    init_one();
    CUevent event = NULL, other = NULL;
    CU_OK(cuEventCreate(&event, CU_EVENT_DEFAULT));
    CU_OK(cuEventCreate(&other, CU_EVENT_BLOCKING_SYNC));
    CU_OK(cuEventQuery(event));
    CU_OK(cuEventSynchronize(event));
    CU_OK(cuEventRecord(other, NULL));
    CU_OK(cuEventSynchronize(other));
    float ms = 0;
    CU_IS(cuEventElapsedTime(&ms, event, other), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cuEventDestroy(event));
    CU_IS(cuEventQuery(event), CUDA_ERROR_INVALID_HANDLE);
}

Test(fakecuda, an_event_holds_the_work_recorded_so_far_and_a_new_record_replaces_it)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CUevent event = NULL;
    CU_OK(cuEventCreate(&event, 0));
    struct order order = {0};
    atomic_int gate_a = 0, gate_b = 0;
    struct step a = {&order, 'A', &gate_a, 0}, b = {&order, 'B', &gate_b, 0};
    CU_OK(cuLaunchHostFunc(stream, step_run, &a));
    CU_OK(cuEventRecord(event, stream));
    CU_OK(cuLaunchHostFunc(stream, step_run, &b));
    CU_IS(cuEventQuery(event), CUDA_ERROR_NOT_READY);
    atomic_store(&gate_a, 1);
    CU_OK(cuEventSynchronize(event));
    cr_assert_eq(atomic_load(&order.n), 1, "the event does not wait for B");
    CU_OK(cuEventRecord(event, stream));
    CU_IS(cuEventQuery(event), CUDA_ERROR_NOT_READY);
    atomic_store(&gate_b, 1);
    CU_OK(cuEventSynchronize(event));
    order_is(&order, "AB");
}

static void nap_20_ms(void *arg)
{
    (void)arg;
    sleep_ms(20);
}

Test(fakecuda, elapsed_time_is_measured_between_completed_timing_events)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CUevent start = NULL, end = NULL, untimed = NULL, pending = NULL;
    CU_OK(cuEventCreate(&start, 0));
    CU_OK(cuEventCreate(&end, 0));
    CU_OK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    CU_OK(cuEventCreate(&pending, 0));
    CU_OK(cuEventRecord(start, stream));
    CU_OK(cuLaunchHostFunc(stream, nap_20_ms, NULL));
    CU_OK(cuEventRecord(end, stream));
    CU_OK(cuEventRecord(untimed, stream));
    CU_OK(cuEventSynchronize(end));
    float ms = -1;
    CU_OK(cuEventElapsedTime(&ms, start, end));
    cr_assert(ms >= 15 && ms < 5000, "elapsed %f ms", (double)ms);
    CU_IS(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0};
    CU_OK(cuLaunchHostFunc(stream, step_run, &a));
    CU_OK(cuEventRecord(pending, stream));
    CU_IS(cuEventElapsedTime(&ms, start, pending), CUDA_ERROR_NOT_READY);
    atomic_store(&gate, 1);
    CU_OK(cuEventSynchronize(pending));
    CU_OK(cuEventElapsedTime(&ms, start, pending));
}

/* ------------------------------------------------------------ kernels */

Test(fakecuda, module_images_need_a_fatbin_or_elf_header)
{
    init_one();
    static const unsigned char fatbin[8] = {0x50, 0xED, 0x55, 0xBA};
    static const unsigned char elf[16] = {0x7F, 'E', 'L', 'F', 2, 1, 1};
    CUmodule module = NULL;
    CU_OK(cuModuleLoadData(&module, fatbin));
    CU_OK(cuModuleUnload(module));
    CU_IS(cuModuleUnload(module), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cuModuleLoadData(&module, elf));
    CU_IS(cuModuleLoadData(&module, "// PTX is not loaded"), CUDA_ERROR_INVALID_IMAGE);
    CU_IS(cuModuleLoadData(&module, NULL), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, functions_come_from_the_registry_by_name)
{
    init_one();
    static const unsigned char fatbin[8] = {0x50, 0xED, 0x55, 0xBA};
    CUmodule module = NULL;
    CU_OK(cuModuleLoadData(&module, fatbin));
    CUfunction fn = NULL, again = NULL;
    CU_OK(cuModuleGetFunction(&fn, module, "fakecuda_test_fill"));
    CU_OK(cuModuleGetFunction(&again, module, "fakecuda_test_fill"));
    cr_assert_eq(fn, again);
    CU_IS(cuModuleGetFunction(&fn, module, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    CU_OK(cuModuleUnload(module));
    uint32_t word = 0;
    struct fakecuda_test_fill_params fill = {&word, 1, 1};
    CU_IS(launch(again, 1, NULL, &fill), CUDA_ERROR_INVALID_HANDLE);
}

Test(fakecuda, fill_kernel_fills_each_blocks_share)
{
    init_one();
    const uint64_t n = 100003;
    CUdeviceptr dptr = 0;
    CU_OK(cuMemAlloc(&dptr, n * 4));
    CU_OK(cuMemsetD8(dptr, 0, n * 4));
    struct fakecuda_test_fill_params fill = {(uint32_t *)dptr, 0xC0FFEE, n};
    CU_OK(launch(kernel("fakecuda_test_fill"), 7, NULL, &fill));
    uint32_t *out = malloc(n * 4);
    CU_OK(cuMemcpyDtoH(out, dptr, n * 4));
    for (uint64_t i = 0; i < n; i++)
        cr_assert_eq(out[i], 0xC0FFEE, "word %lu", (unsigned long)i);
    free(out);
}

Test(fakecuda, kernel_parameters_are_copied_at_launch)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    uint32_t words[4] = {0}, other[4] = {0};
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0};
    CU_OK(cuLaunchHostFunc(stream, step_run, &a)); /* holds the launch back */
    struct fakecuda_test_fill_params fill = {words, 1, 4};
    CU_OK(launch(kernel("fakecuda_test_fill"), 2, stream, &fill));
    fill = (struct fakecuda_test_fill_params){other, 2, 4};
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(stream));
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(words[i], 1);
        cr_assert_eq(other[i], 0);
    }
}

Test(fakecuda, every_block_of_a_launch_makes_progress)
{
    init_one();
    CUdeviceptr slots = 0;
    CU_OK(cuMemAlloc(&slots, 16 * sizeof(uint32_t)));
    CU_OK(cuMemsetD8(slots, 0, 16 * sizeof(uint32_t)));
    struct fakecuda_test_relay_params relay = {(uint32_t *)slots};
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(launch(kernel("fakecuda_test_relay"), 16, stream, &relay)); /* block 0 waits on 1 */
    cr_assert(stream_done_soon(stream), "a block ran alone while it waited on another");
    uint32_t first = 0;
    CU_OK(cuMemcpyDtoH(&first, slots, sizeof(first)));
    cr_assert_eq(first, 16);
}

Test(fakecuda, wait_flag_kernel_runs_until_the_host_sets_the_flag)
{
    init_one();
    uint32_t *flag = NULL, *done = NULL;
    CU_OK(cuMemHostAlloc((void **)&flag, 4, CU_MEMHOSTALLOC_DEVICEMAP));
    CU_OK(cuMemHostAlloc((void **)&done, 4, CU_MEMHOSTALLOC_DEVICEMAP));
    *flag = 0;
    *done = 0;
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    struct fakecuda_test_wait_flag_params wait = {flag, done};
    CU_OK(launch(kernel("fakecuda_test_wait_flag"), 4, stream, &wait));
    sleep_ms(SETTLE_MS);
    CU_IS(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CU_OK(cuStreamSynchronize(stream));
    cr_assert_eq(__atomic_load_n(done, __ATOMIC_ACQUIRE), 4);
}

Test(fakecuda, eight_streams_of_kernels_waiting_on_each_other_all_finish)
{
    init_one();
    enum { N_STREAMS = 8, BLOCKS = 4 };
    uint32_t *flags = NULL, *done = NULL;
    CU_OK(cuMemHostAlloc((void **)&flags, (N_STREAMS + 1) * 4, 0));
    CU_OK(cuMemHostAlloc((void **)&done, N_STREAMS * 4, 0));
    memset(flags, 0, (N_STREAMS + 1) * 4);
    memset(done, 0, N_STREAMS * 4);
    CUfunction wait_fn = kernel("fakecuda_test_wait_flag");
    CUfunction fill_fn = kernel("fakecuda_test_fill");
    CUstream streams[N_STREAMS];
    for (int i = N_STREAMS - 1; i >= 0; i--) { /* the chain runs against launch order */
        CU_OK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
        struct fakecuda_test_wait_flag_params wait = {&flags[i], &done[i]};
        struct fakecuda_test_fill_params pass_on = {&flags[i + 1], 1, 1};
        CU_OK(launch(wait_fn, BLOCKS, streams[i], &wait));
        CU_OK(launch(fill_fn, 1, streams[i], &pass_on));
    }
    __atomic_store_n(&flags[0], 1, __ATOMIC_RELEASE);
    for (int i = 0; i < N_STREAMS; i++)
        cr_assert(stream_done_soon(streams[i]), "stream %d did not finish", i);
    for (int i = 0; i < N_STREAMS; i++)
        cr_assert_eq(done[i], BLOCKS);
    cr_assert_eq(flags[N_STREAMS], 1);
}

Test(fakecuda, launch_configuration_is_checked)
{
    init_on(2, 0);
    CUfunction fn = kernel("fakecuda_test_fill");
    uint32_t word = 0;
    struct fakecuda_test_fill_params fill = {&word, 1, 1};
    void *args[] = {&fill};
    void *extra[] = {NULL};
    CU_IS(cuLaunchKernel(fn, 1, 2, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 2, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 32, 2, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 2, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 1025, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 0, 1, 1, 32, 1, 1, 0, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, extra), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 65536, NULL, args, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuLaunchKernel((CUfunction)&word, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL),
          CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cuLaunchKernel(fn, 1, 1, 1, 1024, 1, 1, 0, NULL, args, NULL));
    CUcontext ctx1 = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
    CU_OK(cuCtxSetCurrent(ctx1));
    CUstream stream1 = NULL;
    CU_OK(cuStreamCreate(&stream1, 0));
    CU_IS(launch(fn, 1, NULL, &fill), CUDA_ERROR_INVALID_HANDLE); /* fn is of device 0 */
    CUfunction fn1 = kernel("fakecuda_test_fill");
    CU_OK(launch(fn1, 1, stream1, &fill));
    CUcontext ctx0 = NULL;
    CU_OK(cuDevicePrimaryCtxRetain(&ctx0, 0));
    CU_OK(cuCtxSetCurrent(ctx0));
    CU_IS(launch(fn, 1, stream1, &fill), CUDA_ERROR_INVALID_HANDLE); /* stream of device 1 */
    CU_OK(cuStreamSynchronize(NULL));
    /* The fill on stream1 writes this frame's word: wait for it before the
     * frame goes (a late write once smashed a later frame's canary). */
    CU_OK(cuStreamSynchronize(stream1));
    CU_OK(cuStreamDestroy(stream1));
    cr_assert_eq(word, 1);
}

Test(fakecuda, launch_fail_after_knob_fails_every_later_launch)
{
    setenv("FAKECUDA_LAUNCH_FAIL_AFTER", "2", 1);
    init_one();
    CUfunction fn = kernel("fakecuda_test_fill");
    uint32_t word = 0;
    struct fakecuda_test_fill_params fill = {&word, 5, 1};
    CU_OK(launch(fn, 1, NULL, &fill));
    CU_OK(launch(fn, 1, NULL, &fill));
    CU_IS(launch(fn, 1, NULL, &fill), CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    CU_IS(launch(fn, 1, NULL, &fill), CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    CU_OK(cuStreamSynchronize(NULL));
    cr_assert_eq(word, 5);
}

/* ------------------------------------------------------------ capture */

static CUstreamCaptureStatus capture_status(CUstream stream)
{
    CUstreamCaptureStatus status = (CUstreamCaptureStatus)-1;
    CU_OK(cuStreamIsCapturing(stream, &status));
    return status;
}

/* End @p stream's capture, which an error invalidated: no graph. */
static void capture_ends_invalidated(CUstream stream)
{
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CUgraph graph = (CUgraph)&graph;
    CU_IS(cuStreamEndCapture(stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_null(graph);
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_NONE);
}

Test(fakecuda, a_captured_stream_records_work_and_the_graph_replays_it_three_times)
{
    init_one();
    const uint64_t n = 1000;
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CUdeviceptr dptr = 0;
    uint32_t *host = NULL;
    CU_OK(cuMemAlloc(&dptr, n * 4));
    CU_OK(cuMemHostAlloc((void **)&host, n * 4, 0));
    CU_OK(cuMemsetD8(dptr, 0xFF, n * 4));
    atomic_int calls = 0;
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cuMemsetD8Async(dptr, 0, n * 4, stream));
    struct fakecuda_test_fill_params fill = {(uint32_t *)dptr, 7, n};
    CU_OK(launch(kernel("fakecuda_test_fill"), 3, stream, &fill));
    fill.value = 9; /* the parameters were copied at capture */
    CU_OK(cuLaunchHostFunc(stream, count_up, &calls));
    CU_OK(cuMemcpyDtoHAsync(host, dptr, n * 4, stream));
    CUgraph graph = NULL;
    CU_OK(cuStreamEndCapture(stream, &graph));
    cr_assert_not_null(graph);
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_NONE);
    cr_assert_eq(atomic_load(&calls), 0, "captured work does not run");
    uint32_t first = 0;
    CU_OK(cuMemcpyDtoH(&first, dptr, 4));
    cr_assert_eq(first, 0xFFFFFFFFu);
    CUgraphExec exec = NULL;
    CU_OK(cuGraphInstantiate(&exec, graph, 0));
    CU_OK(cuGraphDestroy(graph));
    for (int replay = 1; replay <= 3; replay++) {
        memset(host, 0, n * 4);
        CU_OK(cuGraphLaunch(exec, stream));
        CU_OK(cuStreamSynchronize(stream));
        cr_assert_eq(atomic_load(&calls), replay);
        for (uint64_t i = 0; i < n; i++)
            cr_assert_eq(host[i], 7, "replay %d, word %lu", replay, (unsigned long)i);
    }
    CU_OK(cuGraphExecDestroy(exec));
}

Test(fakecuda, the_legacy_stream_cannot_capture)
{
    init_one();
    CU_IS(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_IS(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED),
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(capture_status(NULL), CU_STREAM_CAPTURE_STATUS_NONE);
}

/* The "potentially unsafe" calls, each against a capturing stream. */
struct unsafe_env {
    CUstream capturing;
    CUevent recorded; /* Recorded before the capture began. */
    CUdeviceptr dptr;
    void *pinned;
    char *registered;
    char host[64];
};

static CUresult call_mem_alloc(struct unsafe_env *env)
{
    CUdeviceptr dptr;
    (void)env;
    return cuMemAlloc(&dptr, 64);
}

static CUresult call_mem_free(struct unsafe_env *env)
{
    return cuMemFree(env->dptr);
}

static CUresult call_mem_host_alloc(struct unsafe_env *env)
{
    void *p;
    (void)env;
    return cuMemHostAlloc(&p, 64, 0);
}

static CUresult call_mem_free_host(struct unsafe_env *env)
{
    return cuMemFreeHost(env->pinned);
}

static CUresult call_mem_host_register(struct unsafe_env *env)
{
    return cuMemHostRegister(env->host, sizeof(env->host), 0);
}

static CUresult call_mem_host_unregister(struct unsafe_env *env)
{
    return cuMemHostUnregister(env->registered);
}

static CUresult call_memcpy_htod(struct unsafe_env *env)
{
    return cuMemcpyHtoD(env->dptr, env->host, 16);
}

static CUresult call_memcpy_dtoh(struct unsafe_env *env)
{
    return cuMemcpyDtoH(env->host, env->dptr, 16);
}

static CUresult call_memset_d8(struct unsafe_env *env)
{
    return cuMemsetD8(env->dptr, 0, 16);
}

static CUresult call_stream_synchronize(struct unsafe_env *env)
{
    return cuStreamSynchronize(env->capturing);
}

static CUresult call_stream_query(struct unsafe_env *env)
{
    return cuStreamQuery(env->capturing);
}

static CUresult call_event_query(struct unsafe_env *env)
{
    return cuEventQuery(env->recorded);
}

static CUresult call_event_synchronize(struct unsafe_env *env)
{
    return cuEventSynchronize(env->recorded);
}

static const struct unsafe_call {
    const char *name;
    CUresult (*call)(struct unsafe_env *env);
} unsafe_calls[] = {
    {"cuMemAlloc", call_mem_alloc},
    {"cuMemFree", call_mem_free},
    {"cuMemHostAlloc", call_mem_host_alloc},
    {"cuMemFreeHost", call_mem_free_host},
    {"cuMemHostRegister", call_mem_host_register},
    {"cuMemHostUnregister", call_mem_host_unregister},
    {"cuMemcpyHtoD", call_memcpy_htod},
    {"cuMemcpyDtoH", call_memcpy_dtoh},
    {"cuMemsetD8", call_memset_d8},
    {"cuStreamSynchronize of the capturing stream", call_stream_synchronize},
    {"cuStreamQuery of the capturing stream", call_stream_query},
    {"cuEventQuery of an event recorded before", call_event_query},
    {"cuEventSynchronize of an event recorded before", call_event_synchronize},
};
#define N_UNSAFE_CALLS (sizeof(unsafe_calls) / sizeof(unsafe_calls[0]))

static void unsafe_env_init(struct unsafe_env *env)
{
    static char registered[4096];
    memset(env, 0, sizeof(*env));
    CU_OK(cuStreamCreate(&env->capturing, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemAlloc(&env->dptr, 64));
    CU_OK(cuMemHostAlloc(&env->pinned, 64, 0));
    env->registered = registered;
    CU_OK(cuMemHostRegister(registered, sizeof(registered), 0));
    CU_OK(cuEventCreate(&env->recorded, CU_EVENT_DISABLE_TIMING));
    CU_OK(cuEventRecord(env->recorded, env->capturing));
    CU_OK(cuEventSynchronize(env->recorded));
}

ParameterizedTestParameters(fakecuda, unsafe_calls_during_a_global_capture_fail_and_invalidate_it)
{
    static int indexes[N_UNSAFE_CALLS];
    for (size_t i = 0; i < N_UNSAFE_CALLS; i++)
        indexes[i] = (int)i;
    return cr_make_param_array(int, indexes, N_UNSAFE_CALLS);
}

ParameterizedTest(int *index, fakecuda, unsafe_calls_during_a_global_capture_fail_and_invalidate_it)
{
    const struct unsafe_call *unsafe = &unsafe_calls[*index];
    init_one();
    struct unsafe_env env;
    unsafe_env_init(&env);
    CU_OK(cuStreamBeginCapture(env.capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult got = unsafe->call(&env);
    cr_assert_eq(got, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s -> %s", unsafe->name,
                 err_name(got));
    capture_ends_invalidated(env.capturing);
    got = unsafe->call(&env); /* allowed again once the capture ended */
    cr_assert_eq(got, CUDA_SUCCESS, "%s after the capture -> %s", unsafe->name, err_name(got));
}

struct other_thread_call {
    CUcontext ctx;
    CUresult result;
};

static void *alloc_on_other_thread(void *arg)
{
    struct other_thread_call *call = arg;
    CUdeviceptr dptr;
    cuCtxSetCurrent(call->ctx);
    call->result = cuMemAlloc(&dptr, 64);
    return NULL;
}

static CUresult alloc_from_another_thread(CUcontext ctx)
{
    struct other_thread_call call = {ctx, CUDA_ERROR_UNKNOWN};
    pthread_t thread;
    pthread_create(&thread, NULL, alloc_on_other_thread, &call);
    pthread_join(thread, NULL);
    return call.result;
}

Test(fakecuda, a_global_capture_forbids_unsafe_calls_on_other_threads_too)
{
    CUcontext ctx = init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_IS(alloc_from_another_thread(ctx), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    capture_ends_invalidated(stream);
}

/* What Conflux does around its event queries (cfx_cuda_relaxed_begin):
 * a thread switched to RELAXED may make them during its own GLOBAL capture
 * and another thread's; the exchange hands back the mode it replaced. */
Test(fakecuda, a_relaxed_thread_may_make_unsafe_calls_during_global_captures)
{
    init_one();
    struct unsafe_env env;
    unsafe_env_init(&env);
    CU_OK(cuStreamBeginCapture(env.capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
    cr_assert_eq(mode, CU_STREAM_CAPTURE_MODE_GLOBAL, "the default mode is GLOBAL");
    CU_OK(cuEventQuery(env.recorded));
    CU_OK(cuEventSynchronize(env.recorded));
    CU_IS(cuStreamSynchronize(env.capturing), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    capture_ends_invalidated(env.capturing); /* That sync was never allowed. */
    CU_OK(cuStreamBeginCapture(env.capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuEventQuery(env.recorded));
    cr_assert_eq(capture_status(env.capturing), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cuThreadExchangeStreamCaptureMode(&mode)); /* Back to GLOBAL. */
    cr_assert_eq(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
    CU_IS(cuEventQuery(env.recorded), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    capture_ends_invalidated(env.capturing);
    mode = (CUstreamCaptureMode)7;
    CU_IS(cuThreadExchangeStreamCaptureMode(&mode), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, a_thread_local_capture_forbids_unsafe_calls_on_its_own_thread_only)
{
    CUcontext ctx = init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CU_OK(alloc_from_another_thread(ctx));
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUdeviceptr dptr = 0;
    CU_IS(cuMemAlloc(&dptr, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    capture_ends_invalidated(stream);
}

Test(fakecuda, a_relaxed_capture_allows_unsafe_calls_but_not_a_sync_of_itself)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUdeviceptr dptr = 0;
    CU_OK(cuMemAlloc(&dptr, 64));
    CU_OK(cuMemFree(dptr));
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_IS(cuStreamSynchronize(stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    capture_ends_invalidated(stream);
}

Test(fakecuda, legacy_stream_work_while_a_blocking_stream_captures_is_implicit)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUstreamCaptureStatus status;
    CU_IS(cuStreamIsCapturing(NULL, &status), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE,
                 "a query invalidates not");
    atomic_int calls = 0;
    CU_IS(cuLaunchHostFunc(NULL, count_up, &calls), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    capture_ends_invalidated(stream);
    cr_assert_eq(atomic_load(&calls), 0);
}

Test(fakecuda, a_non_blocking_capture_leaves_the_legacy_stream_usable)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    atomic_int calls = 0;
    CU_OK(cuLaunchHostFunc(NULL, count_up, &calls));
    CU_OK(cuStreamSynchronize(NULL));
    cr_assert_eq(atomic_load(&calls), 1);
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    CU_OK(cuStreamEndCapture(stream, &graph));
    CU_OK(cuGraphDestroy(graph));
}

Test(fakecuda, waiting_on_an_event_recorded_outside_the_capture_is_isolation)
{
    init_one();
    CUstream stream = NULL, other = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUevent event = NULL;
    CU_OK(cuEventCreate(&event, 0));
    CU_OK(cuEventRecord(event, other));
    CU_OK(cuStreamSynchronize(other));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_IS(cuStreamWaitEvent(stream, event, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    capture_ends_invalidated(stream);
}

Test(fakecuda, an_external_event_wait_is_captured_and_waits_at_each_replay)
{
    init_one();
    CUstream stream = NULL, other = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUevent event = NULL;
    CU_OK(cuEventCreate(&event, 0));
    CU_IS(cuStreamWaitEvent(stream, event, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    struct order order = {0};
    struct step b = {&order, 'B', NULL, 0};
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuStreamWaitEvent(stream, event, CU_EVENT_WAIT_EXTERNAL));
    CU_OK(cuLaunchHostFunc(stream, step_run, &b));
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CU_OK(cuStreamEndCapture(stream, &graph));
    CU_OK(cuGraphInstantiate(&exec, graph, 0));
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0};
    CU_OK(cuLaunchHostFunc(other, step_run, &a));
    CU_OK(cuEventRecord(event, other));
    CU_OK(cuGraphLaunch(exec, stream));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0, "the replay did not wait for the event");
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(stream));
    order_is(&order, "AB");
}

Test(fakecuda, an_event_recorded_in_a_capture_cannot_be_queried_or_synchronized)
{
    init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent event = NULL;
    CU_OK(cuEventCreate(&event, 0));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuEventRecord(event, stream));
    CU_IS(cuEventQuery(event), CUDA_ERROR_CAPTURED_EVENT);
    CU_IS(cuEventSynchronize(event), CUDA_ERROR_CAPTURED_EVENT);
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    CU_OK(cuStreamEndCapture(stream, &graph));
    CU_OK(cuEventRecord(event, stream)); /* recorded outside a capture: usable again */
    CU_OK(cuEventSynchronize(event));
}

Test(fakecuda, a_side_stream_joins_a_capture_through_an_event_and_rejoins_it)
{
    init_one();
    CUstream origin = NULL, side = NULL;
    CU_OK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CUevent fork_event = NULL, join_event = NULL;
    CU_OK(cuEventCreate(&fork_event, CU_EVENT_DISABLE_TIMING));
    CU_OK(cuEventCreate(&join_event, CU_EVENT_DISABLE_TIMING));
    struct order order = {0};
    struct step a = {&order, 'A', NULL, 0}, b = {&order, 'B', NULL, 0};
    struct step c = {&order, 'C', NULL, 0};
    CU_OK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuLaunchHostFunc(origin, step_run, &a));
    CU_OK(cuEventRecord(fork_event, origin));
    CU_OK(cuStreamWaitEvent(side, fork_event, 0));
    cr_assert_eq(capture_status(side), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cuLaunchHostFunc(side, step_run, &b));
    CU_OK(cuEventRecord(join_event, side));
    CU_OK(cuStreamWaitEvent(origin, join_event, 0));
    CU_OK(cuLaunchHostFunc(origin, step_run, &c));
    CUgraph graph = NULL;
    CU_OK(cuStreamEndCapture(origin, &graph));
    cr_assert_eq(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    cr_assert_eq(atomic_load(&order.n), 0);
    CUgraphExec exec = NULL;
    CU_OK(cuGraphInstantiate(&exec, graph, 0));
    CU_OK(cuGraphLaunch(exec, origin));
    CU_OK(cuStreamSynchronize(origin));
    order_is(&order, "ABC");
}

Test(fakecuda, ending_a_capture_with_unjoined_side_work_fails)
{
    init_one();
    CUstream origin = NULL, side = NULL;
    CU_OK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CUevent fork_event = NULL;
    CU_OK(cuEventCreate(&fork_event, 0));
    atomic_int calls = 0;
    CU_OK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuEventRecord(fork_event, origin));
    CU_OK(cuStreamWaitEvent(side, fork_event, 0));
    CU_OK(cuLaunchHostFunc(side, count_up, &calls));
    CUgraph graph = (CUgraph)&graph;
    CU_IS(cuStreamEndCapture(side, &graph), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    CU_IS(cuStreamEndCapture(origin, &graph), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    cr_assert_null(graph);
    cr_assert_eq(capture_status(side), CU_STREAM_CAPTURE_STATUS_NONE);
    cr_assert_eq(capture_status(origin), CU_STREAM_CAPTURE_STATUS_NONE);
}

struct end_elsewhere {
    CUcontext ctx;
    CUstream stream;
    CUresult result;
};

static void *end_capture_on_other_thread(void *arg)
{
    struct end_elsewhere *end = arg;
    CUgraph graph;
    cuCtxSetCurrent(end->ctx);
    end->result = cuStreamEndCapture(end->stream, &graph);
    return NULL;
}

Test(fakecuda, a_global_capture_ends_only_on_the_thread_that_began_it)
{
    CUcontext ctx = init_one();
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, 0));
    CU_OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    struct end_elsewhere end = {ctx, stream, CUDA_ERROR_UNKNOWN};
    pthread_t thread;
    pthread_create(&thread, NULL, end_capture_on_other_thread, &end);
    pthread_join(thread, NULL);
    cr_assert_eq(end.result, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "%s", err_name(end.result));
    cr_assert_eq(capture_status(stream), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    CU_OK(cuStreamEndCapture(stream, &graph));
}

Test(fakecuda, launches_of_one_executable_graph_run_one_after_the_other)
{
    init_one();
    CUstream capture_stream = NULL, first = NULL, second = NULL;
    CU_OK(cuStreamCreate(&capture_stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&first, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
    struct order order = {0};
    atomic_int gate = 0;
    struct step a = {&order, 'A', &gate, 0};
    CU_OK(cuStreamBeginCapture(capture_stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuLaunchHostFunc(capture_stream, step_run, &a));
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CU_OK(cuStreamEndCapture(capture_stream, &graph));
    CU_OK(cuGraphInstantiate(&exec, graph, 0));
    CU_OK(cuGraphLaunch(exec, first));
    CU_OK(cuGraphLaunch(exec, second));
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&order.n), 0);
    CU_IS(cuStreamQuery(second), CUDA_ERROR_NOT_READY);
    atomic_store(&gate, 1);
    CU_OK(cuStreamSynchronize(second));
    order_is(&order, "AA");
}

/* ------------------------------------------------------------ cuMem (VMM) */

#define GRANULARITY ((size_t)2 << 20)
#define DEVICE_MEM  ((size_t)80 << 30)

/* Pinned memory on @p device, exportable as a file descriptor when
 * @p exportable. */
static CUmemAllocationProp vmm_prop(int device, int exportable)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes =
        exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    return prop;
}

static CUmemAccessDesc vmm_access(int device, CUmemAccess_flags flags)
{
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof(desc));
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = flags;
    return desc;
}

/* A reservation of @p bytes with @p handle mapped at its start, device
 * @p device allowed to read and write it: what a client does. */
static CUdeviceptr vmm_map_rw(CUmemGenericAllocationHandle handle, size_t bytes, int device)
{
    CUdeviceptr ptr = 0;
    CU_OK(cuMemAddressReserve(&ptr, bytes, 0, 0, 0));
    CU_OK(cuMemMap(ptr, bytes, 0, handle, 0));
    CUmemAccessDesc access = vmm_access(device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_OK(cuMemSetAccess(ptr, bytes, &access, 1));
    return ptr;
}

/* Unmap, free the reservation, release the handle (0: none). */
static void vmm_unmap_free(CUdeviceptr ptr, size_t bytes, CUmemGenericAllocationHandle handle)
{
    CU_OK(cuMemUnmap(ptr, bytes));
    CU_OK(cuMemAddressFree(ptr, bytes));
    if (handle != 0)
        CU_OK(cuMemRelease(handle));
}

/* What touching @p ptr did in a child process: the signal that ended it,
 * or 0. */
static int touch_in_child(volatile unsigned char *ptr, int write)
{
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        if (write)
            *ptr = 1;
        else
            (void)*ptr;
        _exit(0);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

Test(fakecuda, cumem_granularity_is_2_mib_for_pinned_device_memory)
{
    init_on(2, 0);
    CUmemAllocationProp prop = vmm_prop(1, 1);
    size_t granularity = 0;
    CU_OK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    cr_assert_eq(granularity, GRANULARITY);
    granularity = 0;
    CU_OK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    cr_assert_eq(granularity, GRANULARITY);
    CU_IS(cuMemGetAllocationGranularity(NULL, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemGetAllocationGranularity(&granularity, &prop, (CUmemAllocationGranularity_flags)7),
          CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 2;
    CU_IS(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          CUDA_ERROR_INVALID_VALUE);
    prop = vmm_prop(0, 0);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CU_IS(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, cumem_mapped_memory_is_device_memory_of_the_allocations_device)
{
    init_on(2, 1);
    CUmemAllocationProp prop = vmm_prop(1, 1);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 1);
    cr_assert_eq(ptr % GRANULARITY, 0);

    unsigned int type = 0;
    int ordinal = -1;
    CUdeviceptr start = 0;
    size_t range = 0;
    CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr + 100));
    cr_assert_eq(type, CU_MEMORYTYPE_DEVICE);
    CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr + 100));
    cr_assert_eq(ordinal, 1);
    CU_OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr + 100));
    cr_assert_eq(start, ptr);
    CU_OK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr + 100));
    cr_assert_eq(range, GRANULARITY);

    /* Copies, sets and kernels use it, within its bounds. */
    unsigned char in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (unsigned char)(255 - i);
    CUdeviceptr tail = ptr + GRANULARITY - 256;
    CU_OK(cuMemcpyHtoD(tail, in, 256));
    CU_IS(cuMemcpyHtoD(tail + 1, in, 256), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuStreamSynchronize(NULL)); /* from pageable memory it lands late */
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemsetD8Async(tail, 0x5A, 8, stream));
    struct fakecuda_test_fill_params fill = {(uint32_t *)(uintptr_t)ptr, 0xC0FFEE, 64};
    CU_OK(launch(kernel("fakecuda_test_fill"), 2, stream, &fill));
    CU_OK(cuMemcpyDtoHAsync(out, tail, 256, stream));
    CU_OK(cuStreamSynchronize(stream));
    for (int i = 0; i < 256; i++)
        cr_assert_eq(out[i], i < 8 ? 0x5A : 255 - i, "byte %d", i);
    uint32_t words[64];
    CU_OK(cuMemcpyDtoH(words, ptr, sizeof(words)));
    for (int i = 0; i < 64; i++)
        cr_assert_eq(words[i], 0xC0FFEE, "word %d", i);

    /* Unmapped, it is no memory the driver knows; the reservation stays. */
    CU_OK(cuMemUnmap(ptr, GRANULARITY));
    CU_IS(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr),
          CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemsetD8(ptr, 0, 16), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemMap(ptr, GRANULARITY, 0, handle, 0));
    vmm_unmap_free(ptr, GRANULARITY, handle);
    CU_IS(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, cumem_sizes_addresses_and_arguments_are_checked)
{
    init_on(2, 0);
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0;
    CU_IS(cuMemCreate(&handle, GRANULARITY + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemCreate(&handle, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemCreate(&handle, GRANULARITY, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemCreate(NULL, GRANULARITY, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemCreate(&handle, GRANULARITY, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 5;
    CU_IS(cuMemCreate(&handle, GRANULARITY, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
    prop = vmm_prop(0, 0);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    CU_IS(cuMemCreate(&handle, GRANULARITY, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    prop = vmm_prop(0, 0);
    CU_IS(cuMemCreate(&handle, DEVICE_MEM + GRANULARITY, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cuMemCreate(&handle, 2 * GRANULARITY, &prop, 0));

    CUdeviceptr ptr = 0;
    CU_IS(cuMemAddressReserve(&ptr, 1000, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemAddressReserve(&ptr, 4 * GRANULARITY, 3 << 20, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemAddressReserve(&ptr, 4 * GRANULARITY, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAddressReserve(&ptr, 4 * GRANULARITY, 4 * GRANULARITY, 0, 0));
    cr_assert_eq(ptr % (4 * GRANULARITY), 0);

    CU_IS(cuMemMap(ptr, GRANULARITY, 0, handle, 0), CUDA_ERROR_INVALID_VALUE); /* part of it */
    CU_IS(cuMemMap(ptr, GRANULARITY, GRANULARITY, handle, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemMap(ptr, 2 * GRANULARITY, 0, handle, 1), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemMap(ptr + 4096, 2 * GRANULARITY, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemMap(ptr + 3 * GRANULARITY, 2 * GRANULARITY, 0, handle, 0),
          CUDA_ERROR_INVALID_VALUE); /* runs past the reservation */
    CU_IS(cuMemMap(ptr, 2 * GRANULARITY, 0, handle + 8, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemMap(ptr + 2 * GRANULARITY, 2 * GRANULARITY, 0, handle, 0));

    CUdeviceptr mapped = ptr + 2 * GRANULARITY;
    CUmemAccessDesc access = vmm_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_IS(cuMemSetAccess(ptr, 2 * GRANULARITY, &access, 1), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemSetAccess(mapped, GRANULARITY, &access, 1), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemSetAccess(mapped, 2 * GRANULARITY, &access, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemSetAccess(mapped, 2 * GRANULARITY, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    access.location.id = 9;
    CU_IS(cuMemSetAccess(mapped, 2 * GRANULARITY, &access, 1), CUDA_ERROR_INVALID_DEVICE);
    access = vmm_access(0, (CUmemAccess_flags)2);
    CU_IS(cuMemSetAccess(mapped, 2 * GRANULARITY, &access, 1), CUDA_ERROR_INVALID_VALUE);

    CU_IS(cuMemUnmap(ptr, 2 * GRANULARITY), CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
    CU_IS(cuMemUnmap(mapped, GRANULARITY), CUDA_ERROR_INVALID_VALUE);  /* part of a mapping */
    CU_OK(cuMemUnmap(mapped, 2 * GRANULARITY));
    CU_IS(cuMemAddressFree(ptr, 2 * GRANULARITY), CUDA_ERROR_INVALID_VALUE); /* part of it */
    CU_OK(cuMemAddressFree(ptr, 4 * GRANULARITY));
    CU_IS(cuMemAddressFree(ptr, 4 * GRANULARITY), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemRelease(handle));
}

Test(fakecuda, cumem_a_mapped_range_is_not_mapped_again_nor_its_reservation_freed)
{
    init_one();
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle first = 0, second = 0;
    CU_OK(cuMemCreate(&first, GRANULARITY, &prop, 0));
    CU_OK(cuMemCreate(&second, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = 0;
    CU_OK(cuMemAddressReserve(&ptr, 2 * GRANULARITY, 0, 0, 0));
    CU_OK(cuMemMap(ptr, GRANULARITY, 0, first, 0));
    CU_IS(cuMemMap(ptr, GRANULARITY, 0, second, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemMap(ptr, GRANULARITY, 0, first, 0), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemAddressFree(ptr, 2 * GRANULARITY), CUDA_ERROR_INVALID_VALUE);

    /* Two mappings side by side: access and unmap may take both at once,
     * and a copy may not run from one into the other. */
    CU_OK(cuMemMap(ptr + GRANULARITY, GRANULARITY, 0, second, 0));
    CUmemAccessDesc access = vmm_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_OK(cuMemSetAccess(ptr, 2 * GRANULARITY, &access, 1));
    CU_IS(cuMemsetD8(ptr + GRANULARITY - 2, 0x11, 4), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemsetD8(ptr + GRANULARITY - 2, 0x11, 2));
    CU_IS(cuMemAddressFree(ptr, 2 * GRANULARITY), CUDA_ERROR_INVALID_VALUE);
    vmm_unmap_free(ptr, 2 * GRANULARITY, first);
    CU_OK(cuMemRelease(second));
}

Test(fakecuda, cumem_memory_without_access_faults_and_read_access_is_read_only)
{
    init_one();
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = 0;
    CU_OK(cuMemAddressReserve(&ptr, GRANULARITY, 0, 0, 0));
    CU_OK(cuMemMap(ptr, GRANULARITY, 0, handle, 0));
    volatile unsigned char *bytes = (volatile unsigned char *)(uintptr_t)ptr;
    cr_assert_eq(touch_in_child(bytes, 0), SIGSEGV, "mapped without access, yet readable");

    CUmemAccessDesc access = vmm_access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
    CU_OK(cuMemSetAccess(ptr, GRANULARITY, &access, 1));
    cr_assert_eq(touch_in_child(bytes, 0), 0);
    cr_assert_eq(touch_in_child(bytes, 1), SIGSEGV, "read access, yet writable");

    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_OK(cuMemSetAccess(ptr, GRANULARITY, &access, 1));
    cr_assert_eq(touch_in_child(bytes, 1), 0);
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CU_OK(cuMemSetAccess(ptr, GRANULARITY, &access, 1));
    cr_assert_eq(touch_in_child(bytes, 0), SIGSEGV, "access taken back, yet readable");
    vmm_unmap_free(ptr, GRANULARITY, handle);
}

Test(fakecuda, cumem_memory_outlives_its_released_handle_until_unmapped)
{
    init_one();
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0, big = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 0);
    CU_OK(cuMemRelease(handle));
    CU_IS(cuMemMap(ptr, GRANULARITY, 0, handle, 0), CUDA_ERROR_INVALID_VALUE); /* gone */

    unsigned char in[64], out[64] = {0};
    memset(in, 0x3C, sizeof(in));
    CU_OK(cuMemcpyHtoD(ptr + 4096, in, sizeof(in)));
    CU_OK(cuMemcpyDtoH(out, ptr + 4096, sizeof(out)));
    cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
    /* Still counted against the device: all of it is not free. */
    CU_IS(cuMemCreate(&big, DEVICE_MEM, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);

    vmm_unmap_free(ptr, GRANULARITY, 0);
    CU_OK(cuMemCreate(&big, DEVICE_MEM, &prop, 0)); /* never touched: no pages */
    CU_OK(cuMemRelease(big));
}

struct unmap_call {
    CUdeviceptr ptr;
    CUresult result;
    atomic_int returned;
};

static void *unmap_on_other_thread(void *arg)
{
    struct unmap_call *call = arg;
    call->result = cuMemUnmap(call->ptr, GRANULARITY);
    atomic_store(&call->returned, 1);
    return NULL;
}

Test(fakecuda, cumem_unmap_waits_for_the_devices_running_kernels)
{
    init_one();
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 0);
    uint32_t *flag = NULL;
    CU_OK(cuMemHostAlloc((void **)&flag, 4, 0));
    *flag = 0;
    CUstream stream = NULL;
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    struct fakecuda_test_wait_flag_params wait = {flag, (uint32_t *)(uintptr_t)ptr};
    CU_OK(launch(kernel("fakecuda_test_wait_flag"), 2, stream, &wait));

    struct unmap_call call = {ptr, CUDA_ERROR_UNKNOWN, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, unmap_on_other_thread, &call);
    sleep_ms(SETTLE_MS);
    cr_assert_eq(atomic_load(&call.returned), 0, "cuMemUnmap returned under a running kernel");
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    CU_OK(call.result);
    CU_OK(cuMemAddressFree(ptr, GRANULARITY));
    CU_OK(cuMemRelease(handle));
}

Test(fakecuda, cumem_mappings_belong_to_no_context_and_outlive_its_reset)
{
    CUcontext ctx = init_one();
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CU_OK(cuCtxSetCurrent(NULL)); /* none of it needs a current context */
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 0);
    CU_OK(cuCtxSetCurrent(ctx));
    unsigned char in[16], out[16] = {0};
    memset(in, 0x77, sizeof(in));
    CU_OK(cuMemcpyHtoD(ptr, in, sizeof(in)));
    CU_OK(cuDevicePrimaryCtxRelease(0)); /* the last release: a reset */
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_OK(cuMemcpyDtoH(out, ptr, sizeof(out)));
    cr_assert_eq(memcmp(in, out, sizeof(in)), 0);
    vmm_unmap_free(ptr, GRANULARITY, handle);
}

Test(fakecuda, cumem_export_needs_the_fd_handle_type_and_import_a_memfd_of_the_fake)
{
    init_on(2, 0);
    CUmemAllocationProp plain = vmm_prop(0, 0), shared = vmm_prop(1, 1);
    CUmemGenericAllocationHandle handle = 0, exportable = 0, imported = 0;
    int fd = -1;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &plain, 0));
    CU_IS(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemCreate(&exportable, GRANULARITY, &shared, 0));
    CU_IS(
        cuMemExportToShareableHandle(&fd, exportable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
        CUDA_ERROR_INVALID_VALUE);
    CU_IS(cuMemExportToShareableHandle(&fd, exportable, CU_MEM_HANDLE_TYPE_FABRIC, 0),
          CUDA_ERROR_NOT_SUPPORTED);

    int other = memfd_create("not-fakecuda", MFD_CLOEXEC);
    cr_assert_geq(other, 0);
    cr_assert_eq(ftruncate(other, (off_t)GRANULARITY), 0);
    CU_IS(cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)other,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          CUDA_ERROR_INVALID_VALUE);
    close(other);
    CU_IS(cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)9999,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          CUDA_ERROR_INVALID_VALUE);

    /* Imported in the same process: another handle of the same memory, on
     * device 1 as the name of the memfd says. */
    CU_OK(
        cuMemExportToShareableHandle(&fd, exportable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    cr_assert_geq(fd, 0);
    CU_IS(
        cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_WIN32),
        CUDA_ERROR_NOT_SUPPORTED);
    CU_OK(cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    cr_assert_eq(close(fd), 0, "the caller keeps its descriptor");
    cr_assert_neq(imported, exportable);
    CUdeviceptr a = vmm_map_rw(exportable, GRANULARITY, 1);
    CUdeviceptr b = vmm_map_rw(imported, GRANULARITY, 0);
    int ordinal = -1;
    CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b));
    cr_assert_eq(ordinal, 1);
    uint64_t word = 0x1122334455667788u, seen = 0;
    CU_OK(cuMemcpyHtoD(a + 64, &word, sizeof(word)));
    CU_OK(cuMemcpyDtoH(&seen, b + 64, sizeof(seen)));
    cr_assert_eq(seen, word);
    vmm_unmap_free(a, GRANULARITY, exportable);
    vmm_unmap_free(b, GRANULARITY, imported);
    CU_OK(cuMemRelease(handle));
}

/* Send @p fd over the socket @p sock (SCM_RIGHTS); 0 or -1. */
static int send_fd(int sock, int fd)
{
    char byte = 'F';
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr header;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof(control));
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.space,
                         .msg_controllen = sizeof(control.space)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

/* The descriptor sent over @p sock, or -1. */
static int recv_fd(int sock)
{
    char byte = 0;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr header;
        char space[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.space,
                         .msg_controllen = sizeof(control.space)};
    if (recvmsg(sock, &msg, 0) != 1)
        return -1;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg == NULL || cmsg->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd = -1;
    memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
    return fd;
}

#define EXPORTER_WORD 0xE4E4E4E4E4E4E4E4u
#define IMPORTER_WORD 0x1A1A1A1A1A1A1A1Au

/* The importing process (it never called cuInit before its fork): maps the
 * allocation it is sent on device 0, checks it is device 1's memory and
 * holds the exporter's word, writes its own. 0 when all of it worked. */
static int import_in_child(int sock)
{
    int fd = recv_fd(sock);
    CUcontext ctx = NULL;
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr ptr = 0;
    CUmemAccessDesc access = vmm_access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    int ordinal = -1;
    uint64_t seen = 0, mine = IMPORTER_WORD;
    setenv("FAKECUDA_DEVICES", "2", 1);
    int ok =
        fd >= 0 && cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
        cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
        cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS &&
        close(fd) == 0 && cuMemAddressReserve(&ptr, GRANULARITY, 0, 0, 0) == CUDA_SUCCESS &&
        cuMemMap(ptr, GRANULARITY, 0, handle, 0) == CUDA_SUCCESS &&
        cuMemRelease(handle) == CUDA_SUCCESS &&
        cuMemSetAccess(ptr, GRANULARITY, &access, 1) == CUDA_SUCCESS &&
        cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == CUDA_SUCCESS &&
        ordinal == 1 && cuMemcpyDtoH(&seen, ptr, sizeof(seen)) == CUDA_SUCCESS &&
        seen == EXPORTER_WORD && cuMemcpyHtoD(ptr + 8, &mine, sizeof(mine)) == CUDA_SUCCESS &&
        cuStreamSynchronize(NULL) == CUDA_SUCCESS && cuMemUnmap(ptr, GRANULARITY) == CUDA_SUCCESS &&
        cuMemAddressFree(ptr, GRANULARITY) == CUDA_SUCCESS;
    return ok ? 0 : 1;
}

Test(fakecuda, cumem_an_exported_fd_maps_the_same_memory_in_another_process)
{
    int socks[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, socks), 0);
    pid_t child = fork(); /* before cuInit, as ranks do */
    cr_assert_neq(child, -1);
    if (child == 0) {
        close(socks[0]);
        _exit(import_in_child(socks[1]));
    }
    close(socks[1]);
    init_on(2, 1);
    CUmemAllocationProp prop = vmm_prop(1, 1);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 1);
    uint64_t word = EXPORTER_WORD;
    CU_OK(cuMemcpyHtoD(ptr, &word, sizeof(word)));
    CU_OK(cuStreamSynchronize(NULL)); /* landed before the importer looks */
    int fd = -1;
    CU_OK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    cr_assert_eq(send_fd(socks[0], fd), 0);
    close(fd);
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the importer could not map or use the memory");
    CU_OK(cuMemcpyDtoH(&word, ptr + 8, sizeof(word)));
    cr_assert_eq(word, IMPORTER_WORD, "the importer's write is not seen");
    vmm_unmap_free(ptr, GRANULARITY, handle);
    close(socks[0]);
}

Test(fakecuda, no_peer_knob_refuses_cumem_access_from_another_device)
{
    setenv("FAKECUDA_NO_PEER", "1", 1);
    init_on(2, 0);
    CUmemAllocationProp prop = vmm_prop(0, 0);
    CUmemGenericAllocationHandle handle = 0;
    CU_OK(cuMemCreate(&handle, GRANULARITY, &prop, 0));
    CUdeviceptr ptr = vmm_map_rw(handle, GRANULARITY, 0);
    CUmemAccessDesc peer = vmm_access(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_IS(cuMemSetAccess(ptr, GRANULARITY, &peer, 1), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    peer.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CU_OK(cuMemSetAccess(ptr, GRANULARITY, &peer, 1));
    vmm_unmap_free(ptr, GRANULARITY, handle);
}

Test(fakecuda, no_cumem_knob_turns_the_virtual_memory_calls_off)
{
    setenv("FAKECUDA_NO_CUMEM", "1", 1);
    init_one();
    int vmm = -1, fd_handles = -1;
    CU_OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CU_OK(cuDeviceGetAttribute(&fd_handles,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    cr_assert_eq(vmm, 0);
    cr_assert_eq(fd_handles, 0);
    CUmemAllocationProp prop = vmm_prop(0, 1);
    CUmemGenericAllocationHandle handle = 0;
    size_t granularity = 0;
    CUdeviceptr ptr = 0;
    CU_IS(cuMemCreate(&handle, GRANULARITY, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_IS(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          CUDA_ERROR_NOT_SUPPORTED);
    CU_IS(cuMemAddressReserve(&ptr, GRANULARITY, 0, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
}

Test(fakecuda, devices_support_cumem_and_fd_handles_by_default)
{
    init_one();
    int vmm = -1, fd_handles = -1;
    CU_OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CU_OK(cuDeviceGetAttribute(&fd_handles,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    cr_assert_eq(vmm, 1);
    cr_assert_eq(fd_handles, 1);
}

/* ------------------------------------------------------------ fork */

Test(fakecuda, a_child_of_a_process_that_called_cuinit_cannot_use_cuda)
{
    init_one();
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        int n = 0;
        CUcontext ctx = NULL;
        int ok = cuInit(0) == CUDA_ERROR_NOT_INITIALIZED &&
                 cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED &&
                 cuCtxGetCurrent(&ctx) == CUDA_ERROR_NOT_INITIALIZED;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child could use CUDA");
    CUdeviceptr dptr = 0;
    CU_OK(cuMemAlloc(&dptr, 64)); /* the parent still can */
}

Test(fakecuda, a_child_of_a_process_that_never_called_cuinit_works)
{
    pid_t child = fork();
    cr_assert_neq(child, -1);
    if (child == 0) {
        uint32_t words[8] = {0};
        struct fakecuda_test_fill_params fill = {words, 3, 8};
        CUcontext ctx = NULL;
        CUmodule module = NULL;
        CUfunction fn = NULL;
        static const unsigned char fatbin[8] = {0x50, 0xED, 0x55, 0xBA};
        void *args[] = {&fill};
        int ok = cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
                 cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
                 cuModuleLoadData(&module, fatbin) == CUDA_SUCCESS &&
                 cuModuleGetFunction(&fn, module, "fakecuda_test_fill") == CUDA_SUCCESS &&
                 cuLaunchKernel(fn, 2, 1, 1, 32, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS &&
                 cuStreamSynchronize(NULL) == CUDA_SUCCESS && words[7] == 3;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child could not use CUDA");
}

/* ------------------------------------------------------------ exports */

#define ABI_NAME(fn) ABI_STR(fn)
#define ABI_STR(fn)  #fn

/* Every function src/util/cuda.c resolves, by the ABI name <cuda.h> maps
 * it to (the list is generated from cuda.c's CU_SYM lines). */
static const char *const conflux_names[] = {
#define FAKECUDA_CU_SYM(fn) ABI_NAME(fn),
#include "fakecuda_cu_syms.h"
#undef FAKECUDA_CU_SYM
};
#define N_CONFLUX_NAMES (sizeof(conflux_names) / sizeof(conflux_names[0]))

static int conflux_name_index(const char *name)
{
    for (size_t i = 0; i < N_CONFLUX_NAMES; i++)
        if (strcmp(conflux_names[i], name) == 0)
            return (int)i;
    return -1;
}

/* The library's file, mapped; its section headers. */
struct elf_file {
    const unsigned char *bytes;
    size_t size;
    const Elf64_Shdr *sections;
    unsigned n_sections;
};

static void elf_open(struct elf_file *elf, const char *path)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "cannot open %s", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    elf->size = (size_t)st.st_size;
    elf->bytes = mmap(NULL, elf->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    cr_assert_neq(elf->bytes, MAP_FAILED);
    const Elf64_Ehdr *header = (const Elf64_Ehdr *)elf->bytes;
    cr_assert_eq(memcmp(header->e_ident, ELFMAG, SELFMAG), 0);
    cr_assert_eq(header->e_ident[EI_CLASS], ELFCLASS64);
    elf->sections = (const Elf64_Shdr *)(elf->bytes + header->e_shoff);
    elf->n_sections = header->e_shnum;
}

static const Elf64_Shdr *elf_section(const struct elf_file *elf, Elf64_Word type)
{
    for (unsigned i = 0; i < elf->n_sections; i++)
        if (elf->sections[i].sh_type == type)
            return &elf->sections[i];
    return NULL;
}

Test(fakecuda, the_library_exports_exactly_the_functions_conflux_resolves)
{
    const char *path = getenv("FAKECUDA_LIB");
    cr_assert_not_null(path, "ctest sets FAKECUDA_LIB to the library's path");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(lib, "dlopen %s: %s", path, dlerror());
    for (size_t i = 0; i < N_CONFLUX_NAMES; i++)
        cr_assert_not_null(dlsym(lib, conflux_names[i]), "no %s", conflux_names[i]);

    struct elf_file elf;
    elf_open(&elf, path);
    cr_assert_null(elf_section(&elf, SHT_GNU_verdef), "the real driver's names are unversioned");
    const Elf64_Shdr *dynsym = elf_section(&elf, SHT_DYNSYM);
    cr_assert_not_null(dynsym);
    const char *dynstr = (const char *)elf.bytes + elf.sections[dynsym->sh_link].sh_offset;
    const Elf64_Sym *syms = (const Elf64_Sym *)(elf.bytes + dynsym->sh_offset);
    unsigned char seen[N_CONFLUX_NAMES] = {0};
    for (size_t i = 0; i < dynsym->sh_size / sizeof(Elf64_Sym); i++) {
        const Elf64_Sym *sym = &syms[i];
        int bind = ELF64_ST_BIND(sym->st_info);
        if (sym->st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK))
            continue;
        const char *name = dynstr + sym->st_name;
        int index = conflux_name_index(name);
        cr_assert_geq(index, 0, "exports %s, which Conflux does not resolve", name);
        seen[index] = 1;
    }
    for (size_t i = 0; i < N_CONFLUX_NAMES; i++)
        cr_assert(seen[i], "%s is not in the dynamic symbol table", conflux_names[i]);

    const Elf64_Shdr *dynamic = elf_section(&elf, SHT_DYNAMIC);
    cr_assert_not_null(dynamic);
    const char *dynamic_str = (const char *)elf.bytes + elf.sections[dynamic->sh_link].sh_offset;
    const Elf64_Dyn *dyn = (const Elf64_Dyn *)(elf.bytes + dynamic->sh_offset);
    const char *soname = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++)
        if (dyn->d_tag == DT_SONAME)
            soname = dynamic_str + dyn->d_un.d_val;
    cr_assert_not_null(soname);
    cr_assert_str_eq(soname, "libcuda.so.1");
    munmap((void *)elf.bytes, elf.size);
}
