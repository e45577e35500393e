/* Multi-rank test harness: see harness.h. */
#include "tests/harness.h"
#include "tests/harness_gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/util/log.h"
#include "src/util/param.h"

#define MAX_RANKS 64

enum slot_state { SLOT_IDLE = 0, SLOT_RUNNING = 1, SLOT_DONE = 2 };

struct slot {
    int state;
    int failed;
    char step[160];
    char message[640];
};

/* Shared between ranks and the runner: MAP_SHARED, so forked ranks write it too. */
struct shared_area {
    int id_ready;
    cfxUniqueId id;
    struct slot slots[MAX_RANKS];
};

static struct shared_area *area;
static _Thread_local struct slot *my_slot;

/* Tests talk to one another only over loopback. */
__attribute__((constructor)) static void harness_env(void)
{
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
}

void cfx_test_setenv(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    cfx_param_reset_all();
    cfx_log_reset();
}

const char *cfx_test_use_fakeverbs(void)
{
    const char *lib = getenv("CFX_TEST_FAKEVERBS");
    if (lib == NULL || lib[0] == '\0' || access(lib, R_OK) != 0)
        return NULL;
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/cfx-fakeverbs-test-%d", (int)getpid());
    cfx_test_setenv("FAKEVERBS_DIR", dir);
    cfx_test_setenv("FAKEVERBS_ADDR", "127.0.0.1"); /* Its TCP stays on loopback. */
    /* 4.096 us x 2^14 x 8 tries: a write to a dead queue pair fails in 0.5 s. */
    cfx_test_setenv("CFX_IB_TIMEOUT", "14");
    cfx_test_setenv("CFX_IB_VERBS_LIB", lib);
    cfx_test_setenv("CFX_NET", "IB");
    return lib;
}

#if CFX_HAVE_CUDA
/* Whether this machine's CUDA driver finds a GPU, asked in a child so that
 * this process stays without CUDA. */
static int real_gpu_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(unsigned) = lib ? (int (*)(unsigned))dlsym(lib, "cuInit") : NULL;
        int (*count)(int *) = lib ? (int (*)(int *))dlsym(lib, "cuDeviceGetCount") : NULL;
        int n = 0;
        _exit(init && count && init(0) == 0 && count(&n) == 0 && n > 0 ? 0 : 1);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

#endif

const char *cfx_test_use_cuda(const char **why_p)
{
#if !CFX_HAVE_CUDA
    *why_p = "built without the CUDA toolkit";
    return NULL;
#else
    const char *gpu = getenv("CFX_TEST_GPU");
    if (gpu != NULL && strcmp(gpu, "1") == 0) {
        if (!real_gpu_present()) {
            *why_p = "CFX_TEST_GPU=1 but this machine's CUDA driver finds no GPU";
            return NULL;
        }
        cfx_test_setenv("CFX_CUDA_DRIVER_LIB", NULL);
        return "GPU";
    }
    const char *lib = getenv("CFX_TEST_FAKECUDA");
    if (lib == NULL || lib[0] == '\0' || access(lib, R_OK) != 0) {
        *why_p = "no fake-cuda driver (CFX_TEST_FAKECUDA unset: run through ctest) and "
                 "CFX_TEST_GPU is not 1";
        return NULL;
    }
    cfx_test_setenv("CFX_CUDA_DRIVER_LIB", lib);
    return "fake-cuda";
#endif
}

#if CFX_HAVE_CUDA
#define GPU_CHECK(ctx, call, what)                                                                 \
    do {                                                                                           \
        CUresult gpu_err_ = (call);                                                                \
        if (gpu_err_ != CUDA_SUCCESS) {                                                            \
            cfx_test_fail((ctx), __FILE__, __LINE__, "%s: CUDA error %d", what, (int)gpu_err_);    \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)

int cfx_test_gpu_open(struct cfx_test_rank *ctx, int device, struct cfx_test_gpu *gpu)
{
    const char *why = NULL;
    memset(gpu, 0, sizeof(*gpu));
    gpu->cu = cfx_cuda_api(&why);
    if (gpu->cu == NULL) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "CUDA: %s", why);
        return 0;
    }
    if (cfx_cuda_select(device) != cfxSuccess) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "device %d: %s", device, cfxGetLastError(NULL));
        return 0;
    }
    gpu->device = device;
    GPU_CHECK(ctx, gpu->cu->stream_create(&gpu->stream, CU_STREAM_NON_BLOCKING), "stream");
    const char *pageable = getenv("CFX_TEST_GPU_PAGEABLE");
    if (pageable == NULL || strcmp(pageable, "1") != 0) {
        gpu->bounce_bytes = 4u << 20;
        GPU_CHECK(ctx, gpu->cu->mem_host_alloc((void **)&gpu->bounce, gpu->bounce_bytes, 0),
                  "cuMemHostAlloc");
    }
    return 1;
}

void *cfx_test_gpu_alloc(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, size_t bytes)
{
    CUdeviceptr ptr = 0;
    CUresult err = gpu->cu->mem_alloc(&ptr, bytes > 0 ? bytes : 1);
    /* On the rank's stream: cuMemsetD8 lands late, on the legacy stream,
     * which the rank's non-blocking stream does not wait for. */
    if (err == CUDA_SUCCESS)
        err = gpu->cu->memset_d8_async(ptr, 0xee, bytes, gpu->stream);
    if (err == CUDA_SUCCESS)
        err = gpu->cu->stream_synchronize(gpu->stream);
    if (err != CUDA_SUCCESS) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "cuMemAlloc(%zu): CUDA error %d", bytes, (int)err);
        return NULL;
    }
    return (void *)(uintptr_t)ptr;
}

void cfx_test_gpu_free(struct cfx_test_gpu *gpu, void *ptr)
{
    if (ptr != NULL)
        gpu->cu->mem_free((CUdeviceptr)(uintptr_t)ptr);
}

int cfx_test_gpu_sync(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu)
{
    GPU_CHECK(ctx, gpu->cu->stream_synchronize(gpu->stream), "cuStreamSynchronize");
    return 1;
}

int cfx_test_gpu_put(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, void *dst,
                     const void *src, size_t bytes)
{
    if (bytes == 0)
        return 1;
    if (gpu->bounce == NULL) {
        GPU_CHECK(ctx,
                  gpu->cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)dst, src, bytes, gpu->stream),
                  "cuMemcpyHtoDAsync");
        return cfx_test_gpu_sync(ctx, gpu);
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < gpu->bounce_bytes ? bytes - done : gpu->bounce_bytes;
        memcpy(gpu->bounce, (const char *)src + done, n);
        GPU_CHECK(ctx,
                  gpu->cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)((char *)dst + done),
                                             gpu->bounce, n, gpu->stream),
                  "cuMemcpyHtoDAsync");
        if (!cfx_test_gpu_sync(ctx, gpu))
            return 0;
        done += n;
    }
    return 1;
}

int cfx_test_gpu_get(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, void *dst,
                     const void *src, size_t bytes)
{
    if (bytes == 0)
        return 1;
    if (gpu->bounce == NULL) {
        GPU_CHECK(ctx,
                  gpu->cu->memcpy_dtoh_async(dst, (CUdeviceptr)(uintptr_t)src, bytes, gpu->stream),
                  "cuMemcpyDtoHAsync");
        return cfx_test_gpu_sync(ctx, gpu);
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < gpu->bounce_bytes ? bytes - done : gpu->bounce_bytes;
        GPU_CHECK(ctx,
                  gpu->cu->memcpy_dtoh_async(gpu->bounce,
                                             (CUdeviceptr)(uintptr_t)((const char *)src + done), n,
                                             gpu->stream),
                  "cuMemcpyDtoHAsync");
        if (!cfx_test_gpu_sync(ctx, gpu))
            return 0;
        memcpy((char *)dst + done, gpu->bounce, n);
        done += n;
    }
    return 1;
}

void cfx_test_gpu_close(struct cfx_test_gpu *gpu)
{
    if (gpu->cu != NULL && gpu->stream != NULL)
        gpu->cu->stream_destroy(gpu->stream);
    gpu->stream = NULL;
    if (gpu->cu != NULL && gpu->bounce != NULL)
        gpu->cu->mem_free_host(gpu->bounce);
    gpu->bounce = NULL;
}
#endif

void cfx_test_step(struct cfx_test_rank *ctx, const char *fmt, ...)
{
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(my_slot->step, sizeof(my_slot->step), fmt, ap);
    va_end(ap);
}

void cfx_test_fail(struct cfx_test_rank *ctx, const char *file, int line, const char *fmt, ...)
{
    ctx->slot_failed = 1;
    if (my_slot->failed)
        return;
    my_slot->failed = 1;
    int n = snprintf(my_slot->message, sizeof(my_slot->message), "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(my_slot->message + n, sizeof(my_slot->message) - (size_t)n, fmt, ap);
    va_end(ap);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct rank_job {
    struct cfx_test_rank ctx;
    cfx_test_rank_fn fn;
    const struct cfx_test_options *opts;
    pthread_t thread;
};

/* Ranks of a process run get the id from rank 0 through the shared area. */
static int obtain_id(struct rank_job *job, double deadline)
{
    struct cfx_test_rank *ctx = &job->ctx;
    if (job->opts->id_mode == CFX_TEST_ID_ENV) {
        cfx_test_step(ctx, "cfxGetUniqueId (CFX_COMM_ID)");
        cfxResult_t res = cfxGetUniqueId(&ctx->id);
        if (res != cfxSuccess) {
            cfx_test_fail(ctx, __FILE__, __LINE__, "cfxGetUniqueId: %s", cfxGetLastError(NULL));
            return 0;
        }
        return 1;
    }
    if (job->opts->mode == CFX_TEST_THREADS || job->opts->id != NULL) {
        ctx->id = area->id;
        return 1;
    }
    if (ctx->rank == 0) {
        cfx_test_step(ctx, "cfxGetUniqueId");
        cfxResult_t res = cfxGetUniqueId(&area->id);
        if (res != cfxSuccess) {
            cfx_test_fail(ctx, __FILE__, __LINE__, "cfxGetUniqueId: %s", cfxGetLastError(NULL));
            return 0;
        }
        __atomic_store_n(&area->id_ready, 1, __ATOMIC_RELEASE);
    }
    cfx_test_step(ctx, "waiting for rank 0's unique id");
    while (!__atomic_load_n(&area->id_ready, __ATOMIC_ACQUIRE)) {
        if (now_s() > deadline) {
            cfx_test_fail(ctx, __FILE__, __LINE__, "rank 0 never published a unique id");
            return 0;
        }
        usleep(1000);
    }
    ctx->id = area->id;
    return 1;
}

static void run_rank(struct rank_job *job, double deadline)
{
    my_slot = &area->slots[job->ctx.rank];
    if (job->opts->before_rank)
        job->opts->before_rank(&job->ctx);
    if (obtain_id(job, deadline)) {
        cfx_test_step(&job->ctx, "running");
        job->fn(&job->ctx);
    }
    if (!my_slot->failed)
        snprintf(my_slot->step, sizeof(my_slot->step), "finished");
    __atomic_store_n(&my_slot->state, SLOT_DONE, __ATOMIC_RELEASE);
}

static double g_deadline;

static void *rank_thread(void *arg)
{
    run_rank(arg, g_deadline);
    return NULL;
}

static void append(char *report, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *report, size_t size, const char *fmt, ...)
{
    size_t used = strlen(report);
    if (used + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(report + used, size - used, fmt, ap);
    va_end(ap);
}

int cfx_test_run(const struct cfx_test_options *opts, cfx_test_rank_fn fn, char *report,
                 size_t report_size)
{
    int nranks = opts->nranks;
    double deadline_s = opts->deadline_s > 0 ? opts->deadline_s : 60;
    double deadline = now_s() + deadline_s;
    report[0] = '\0';
    if (nranks < 1 || nranks > MAX_RANKS) {
        snprintf(report, report_size, "harness: nranks %d out of range", nranks);
        return 0;
    }
    area = mmap(NULL, sizeof(*area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) {
        snprintf(report, report_size, "harness: mmap failed: %s", strerror(errno));
        return 0;
    }
    memset(area, 0, sizeof(*area));
    struct rank_job *jobs = calloc((size_t)nranks, sizeof(*jobs));
    pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
    g_deadline = deadline;
    if (opts->id != NULL) {
        area->id = *opts->id;
    } else if (opts->mode == CFX_TEST_THREADS && opts->id_mode == CFX_TEST_ID_BCAST) {
        cfxResult_t res = cfxGetUniqueId(&area->id);
        if (res != cfxSuccess) {
            snprintf(report, report_size, "cfxGetUniqueId: %s", cfxGetLastError(NULL));
            return 0;
        }
    }
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nranks; r++) {
        jobs[r].ctx = (struct cfx_test_rank){
            .rank = r, .nranks = nranks, .mode = opts->mode, .arg = opts->arg};
        jobs[r].fn = fn;
        jobs[r].opts = opts;
        if (opts->skip_ranks & (1ull << r)) {
            area->slots[r].state = SLOT_DONE;
            snprintf(area->slots[r].step, sizeof(area->slots[r].step), "skipped");
            continue;
        }
        area->slots[r].state = SLOT_RUNNING;
        snprintf(area->slots[r].step, sizeof(area->slots[r].step), "starting");
        if (opts->mode == CFX_TEST_PROCS) {
            pid_t pid = fork();
            if (pid == 0) {
                run_rank(&jobs[r], deadline);
                _exit(area->slots[r].failed ? 1 : 0);
            }
            pids[r] = pid;
        } else {
            pthread_create(&jobs[r].thread, NULL, rank_thread, &jobs[r]);
        }
    }
    /* Wait for every rank, or the deadline. */
    int all_done = 0;
    while (!all_done && now_s() < deadline) {
        all_done = 1;
        for (int r = 0; r < nranks; r++) {
            if (opts->mode == CFX_TEST_PROCS && pids[r] > 0) {
                int status;
                pid_t got = waitpid(pids[r], &status, WNOHANG);
                if (got == pids[r]) {
                    pids[r] = 0;
                    int expected_kill = (opts->killed_ranks & (1ull << r)) && WIFSIGNALED(status) &&
                                        WTERMSIG(status) == SIGKILL;
                    if (expected_kill)
                        snprintf(area->slots[r].step, sizeof(area->slots[r].step),
                                 "killed, as planned");
                    else if (WIFSIGNALED(status) ||
                             (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                              !area->slots[r].failed)) {
                        area->slots[r].failed = 1;
                        snprintf(area->slots[r].message, sizeof(area->slots[r].message),
                                 "process died (%s %d) at step \"%s\"",
                                 WIFSIGNALED(status) ? "signal" : "exit code",
                                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                                 area->slots[r].step);
                    }
                    area->slots[r].state = SLOT_DONE;
                }
            }
            if (__atomic_load_n(&area->slots[r].state, __ATOMIC_ACQUIRE) != SLOT_DONE ||
                (opts->mode == CFX_TEST_PROCS && pids[r] > 0))
                all_done = 0;
        }
        if (!all_done)
            usleep(2000);
    }
    int ok = 1;
    for (int r = 0; r < nranks; r++) {
        struct slot *slot = &area->slots[r];
        if (__atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) != SLOT_DONE ||
            (opts->mode == CFX_TEST_PROCS && pids[r] > 0)) {
            ok = 0;
            append(report, report_size,
                   "rank %d of %d (%s) hung past the %.0f s deadline at step \"%s\"\n", r, nranks,
                   opts->mode == CFX_TEST_PROCS ? "process" : "thread", deadline_s, slot->step);
        } else if (slot->failed) {
            ok = 0;
            append(report, report_size, "rank %d of %d (%s) failed: %s\n", r, nranks,
                   opts->mode == CFX_TEST_PROCS ? "process" : "thread", slot->message);
        }
    }
    if (opts->mode == CFX_TEST_PROCS) {
        for (int r = 0; r < nranks; r++)
            if (pids[r] > 0) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], NULL, 0);
            }
    } else if (all_done) {
        for (int r = 0; r < nranks; r++)
            if (!(opts->skip_ranks & (1ull << r)))
                pthread_join(jobs[r].thread, NULL);
    }
    /* Hung threads keep their jobs and the area: the test fails and its
     * process exits, so leaking them is the safe choice. */
    if (ok) {
        free(jobs);
        munmap(area, sizeof(*area));
        area = NULL;
    }
    free(pids);
    return ok;
}

/* ------------------------------------------------------------ logs */

void cfx_test_log_to(char *prefix, size_t size, const char *what)
{
    snprintf(prefix, size, "/tmp/cfx-test-%s-%d", what, (int)getpid());
    cfx_test_remove_logs(prefix);
    char pattern[160];
    snprintf(pattern, sizeof(pattern), "%s.%%p", prefix);
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "INIT,NET,P2P");
    cfx_test_setenv("CFX_DEBUG_FILE", pattern);
}

void cfx_test_logs_off(void)
{
    cfx_test_setenv("CFX_DEBUG", NULL);
    cfx_test_setenv("CFX_DEBUG_SUBSYS", NULL);
    cfx_test_setenv("CFX_DEBUG_FILE", NULL);
}

int cfx_test_count_in_logs(const char *prefix, const char *needle)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "cat %s.* 2>/dev/null", prefix);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), p))
        n += strstr(line, needle) != NULL;
    pclose(p);
    return n;
}

void cfx_test_remove_logs(const char *prefix)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -f %s.*", prefix);
    if (system(cmd) != 0) {
        /* Nothing to remove. */
    }
}

/* ------------------------------------------------------------ checked calls */

void cfx_test_allreduce_check(struct cfx_test_rank *ctx, cfxComm_t comm, size_t count)
{
    float *data = malloc(count * sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    for (size_t i = 0; i < count; i++)
        data[i] = (float)(ctx->rank + 1) + (float)(i % 7);
    cfx_test_step(ctx, "allreduce of %zu floats", count);
    cfxResult_t res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    if (res != cfxSuccess)
        free(data);
    RANK_ASSERT(ctx, res == cfxSuccess, "allreduce of %zu: %s: %s", count, cfxGetErrorString(res),
                cfxGetLastError(comm));
    float ranks_sum = (float)(ctx->nranks * (ctx->nranks + 1) / 2);
    for (size_t i = 0; i < count; i++) {
        float want = ranks_sum + (float)ctx->nranks * (float)(i % 7);
        if (data[i] != want) {
            double got = data[i];
            free(data);
            RANK_ASSERT(ctx, 0, "allreduce of %zu: element %zu is %g, not %g", count, i, got,
                        (double)want);
        }
    }
    free(data);
}
