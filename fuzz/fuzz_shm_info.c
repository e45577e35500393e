/*
 * The shm transport's connect info (transports/shm/wire.h): what a sender
 * accepts before it opens a peer's descriptor through /proc or takes a FIFO
 * address.
 */
#include "fuzz/fuzz.h"
#include "transports/shm/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in = {data, size};
    uint8_t flags = fuzz_u8(&in);
    uint64_t expect_bytes = (uint64_t)fuzz_u32(&in) << (flags >> 4);
    int expect_pid = (int)(fuzz_u32(&in) & 0x7fffffff);
    int same_process = flags & 1;
    unsigned char blob[CFX_CONNECT_INFO_BYTES];
    fuzz_take(&in, blob, sizeof(blob));
    struct cfx_shm_info info;
    memcpy(&info, blob, sizeof(info));
    if (cfx_shm_info_refusal(&info, expect_bytes, expect_pid, same_process) != NULL)
        return 0;
    FUZZ_CHECK(info.bytes == expect_bytes);
    FUZZ_CHECK((info.flags & ~CFX_SHM_FLAG_LL) == 0);
    if (info.kind == CFX_SHM_KIND_LOCAL) {
        FUZZ_CHECK(same_process && info.local_addr != 0 && info.local_addr % 4096 == 0);
        return 0;
    }
    FUZZ_CHECK(info.kind == CFX_SHM_KIND_MEMFD);
    FUZZ_CHECK(!same_process && info.pid > 0 && info.pid == expect_pid && info.fd >= 0);
    return 0;
}
