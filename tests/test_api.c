/*
 * The public API's promises that need no peers: version, result names,
 * error sentences, and every argument check at the entry points.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "src/core/argcheck.h"
#include "src/core/comm.h"
#include "tests/harness.h"

/* The sentence of the last failure mentions @p word. */
#define ASSERT_SENTENCE(word)                                                                      \
    cr_assert(strstr(cfxGetLastError(NULL), (word)) != NULL,                                       \
              "cfxGetLastError does not mention \"%s\": \"%s\"", (word), cfxGetLastError(NULL))

Test(api, version_matches_the_header)
{
    int version = 0;
    cr_assert_eq(cfxGetVersion(&version), cfxSuccess);
    cr_assert_eq(version, CFX_VERSION_CODE);
    cr_assert_eq(CFX_VERSION_CODE, CFX_MAJOR * 10000 + CFX_MINOR * 100 + CFX_PATCH);
}

Test(api, enum_values_mirror_nccl)
{
    cr_assert_eq(cfxSuccess, 0);
    cr_assert_eq(cfxUnhandledCudaError, 1);
    cr_assert_eq(cfxSystemError, 2);
    cr_assert_eq(cfxInternalError, 3);
    cr_assert_eq(cfxInvalidArgument, 4);
    cr_assert_eq(cfxInvalidUsage, 5);
    cr_assert_eq(cfxRemoteError, 6);
    cr_assert_eq(cfxInProgress, 7);
    cr_assert_eq(cfxTimeout, 8);
    cr_assert_eq(cfxNumResults, 9);
    cr_assert_eq(cfxInt8, 0);
    cr_assert_eq(cfxChar, 0);
    cr_assert_eq(cfxUint8, 1);
    cr_assert_eq(cfxInt32, 2);
    cr_assert_eq(cfxInt, 2);
    cr_assert_eq(cfxUint32, 3);
    cr_assert_eq(cfxInt64, 4);
    cr_assert_eq(cfxUint64, 5);
    cr_assert_eq(cfxFloat16, 6);
    cr_assert_eq(cfxHalf, 6);
    cr_assert_eq(cfxFloat32, 7);
    cr_assert_eq(cfxFloat, 7);
    cr_assert_eq(cfxFloat64, 8);
    cr_assert_eq(cfxDouble, 8);
    cr_assert_eq(cfxBfloat16, 9);
    cr_assert_eq(cfxFloat8e4m3, 10);
    cr_assert_eq(cfxFloat8e5m2, 11);
    cr_assert_eq(cfxNumTypes, 12);
    cr_assert_eq(cfxSum, 0);
    cr_assert_eq(cfxProd, 1);
    cr_assert_eq(cfxMax, 2);
    cr_assert_eq(cfxMin, 3);
    cr_assert_eq(cfxAvg, 4);
    cr_assert_eq(cfxNumOps, 5);
    cr_assert_eq(sizeof(cfxUniqueId), 128);
    cr_assert_eq(CFX_SPLIT_NOCOLOR, -1);
}

Test(api, every_result_has_a_distinct_name)
{
    for (int a = 0; a < cfxNumResults; a++) {
        const char *name = cfxGetErrorString((cfxResult_t)a);
        cr_assert(name != NULL && name[0] != '\0');
        for (int b = 0; b < a; b++)
            cr_assert_str_neq(name, cfxGetErrorString((cfxResult_t)b));
    }
    cr_assert_str_eq(cfxGetErrorString((cfxResult_t)99), "unknown result code");
    cr_assert_str_eq(cfxGetErrorString(cfxSuccess), "no error");
}

Test(api, config_initializer_sets_size_magic_version_and_undefined_fields)
{
    cfxConfig_t config = CFX_CONFIG_INITIALIZER;
    cr_assert_eq(config.size, sizeof(cfxConfig_t));
    cr_assert_eq(config.magic, 0xcafebeef);
    cr_assert_eq(config.version, (unsigned)CFX_VERSION_CODE);
    cr_assert_eq(config.blocking, CFX_CONFIG_UNDEF_INT);
    cr_assert_null(config.commName);
    cr_assert_eq(config.splitShare, CFX_CONFIG_UNDEF_INT);
    cr_assert_eq(config.minCTAs, CFX_CONFIG_UNDEF_INT);
    cr_assert_eq(config.maxCTAs, CFX_CONFIG_UNDEF_INT);
    cr_assert_null(config.netName);
    cr_assert_eq(config.timeout, CFX_CONFIG_UNDEF_INT);
}

/* ------------------------------------------------------- entry checks */

Test(argcheck, null_output_pointers_are_invalid_arguments)
{
    cfxUniqueId id;
    cr_assert_eq(cfxGetVersion(NULL), cfxInvalidArgument);
    ASSERT_SENTENCE("cfxGetVersion: version is NULL");
    cr_assert_eq(cfxGetUniqueId(NULL), cfxInvalidArgument);
    ASSERT_SENTENCE("uniqueId is NULL");
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cr_assert_eq(cfxCommInitRank(NULL, 1, id, 0), cfxInvalidArgument);
    ASSERT_SENTENCE("comm is NULL");
    cr_assert_eq(cfxCommInitAll(NULL, 2, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE("comms is NULL");
}

Test(argcheck, null_communicator_is_an_invalid_argument_everywhere)
{
    int value;
    cfxResult_t async;
    cfxComm_t child;
    cr_assert_eq(cfxCommCount(NULL, &value), cfxInvalidArgument);
    ASSERT_SENTENCE("cfxCommCount: comm is NULL");
    cr_assert_eq(cfxCommUserRank(NULL, &value), cfxInvalidArgument);
    ASSERT_SENTENCE("cfxCommUserRank: comm is NULL");
    cr_assert_eq(cfxCommCuDevice(NULL, &value), cfxInvalidArgument);
    ASSERT_SENTENCE("cfxCommCuDevice: comm is NULL");
    cr_assert_eq(cfxCommGetAsyncError(NULL, &async), cfxInvalidArgument);
    cr_assert_eq(cfxCommSplit(NULL, 0, 0, &child, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommFinalize(NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommDestroy(NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommAbort(NULL), cfxInvalidArgument);
    ASSERT_SENTENCE("cfxCommAbort: comm is NULL");
}

Test(argcheck, rank_and_nranks_out_of_range_are_invalid_arguments)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cr_assert_eq(cfxCommInitRank(&comm, 0, id, 0), cfxInvalidArgument);
    ASSERT_SENTENCE("nranks = 0");
    cr_assert_eq(cfxCommInitRank(&comm, -3, id, 0), cfxInvalidArgument);
    cr_assert_eq(cfxCommInitRank(&comm, 4, id, 4), cfxInvalidArgument);
    ASSERT_SENTENCE("rank = 4 is out of range [0, 4)");
    cr_assert_eq(cfxCommInitRank(&comm, 4, id, -1), cfxInvalidArgument);
    cr_assert_eq(cfxCommInitRank(&comm, INT_MAX, id, 0), cfxInvalidArgument);
    cr_assert_eq(cfxCommInitAll((cfxComm_t[1]){0}, 0, NULL), cfxInvalidArgument);
    cr_assert_null(comm, "comm set although init failed");
}

Test(argcheck, an_id_that_is_not_from_cfxGetUniqueId_is_refused)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    memset(&id, 0x42, sizeof(id));
    cr_assert_eq(cfxCommInitRank(&comm, 2, id, 0), cfxInvalidArgument);
    ASSERT_SENTENCE("not a Conflux unique id");
    cr_assert_null(comm);
}

Test(argcheck, malformed_configs_are_refused)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cfxConfig_t config = CFX_CONFIG_INITIALIZER;
    config.magic = 0;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    ASSERT_SENTENCE("CFX_CONFIG_INITIALIZER");
    config = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    config.size = sizeof(config) + 64;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    ASSERT_SENTENCE("newer conflux.h");
    config = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    config.blocking = 2;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    ASSERT_SENTENCE("blocking = 2");
    config = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    config.minCTAs = 8;
    config.maxCTAs = 4;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    ASSERT_SENTENCE("minCTAs = 8, maxCTAs = 4");
    config = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    config.splitShare = -5;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    cr_assert_null(comm);
    config = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    config.timeout = -5;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxInvalidArgument);
    ASSERT_SENTENCE("timeout = -5");
    cr_assert_null(comm);
    /* A caller built against a header without the field: it is not read. */
    config.size = offsetof(cfxConfig_t, timeout);
    cfxResult_t res = cfxCommInitRankConfig(&comm, 1, id, 0, &config);
    cr_assert_eq(res, cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(argcheck, a_valid_config_is_accepted_for_a_one_rank_communicator)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cfxConfig_t config = CFX_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "solo";
    config.minCTAs = 1;
    config.maxCTAs = 4;
    cr_assert_eq(cfxCommInitRankConfig(&comm, 1, id, 0, &config), cfxSuccess, "%s",
                 cfxGetLastError(NULL));
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

/* One live one-rank communicator for the checks that need one. */
static cfxComm_t solo(void)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cr_assert_eq(cfxCommInitRank(&comm, 1, id, 0), cfxSuccess, "%s", cfxGetLastError(NULL));
    return comm;
}

Test(argcheck, null_query_outputs_are_invalid_arguments_and_recorded_on_the_comm)
{
    cfxComm_t comm = solo();
    cr_assert_eq(cfxCommCount(comm, NULL), cfxInvalidArgument);
    cr_assert(strstr(cfxGetLastError(comm), "cfxCommCount: output pointer is NULL") != NULL, "%s",
              cfxGetLastError(comm));
    cr_assert_eq(cfxCommUserRank(comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommCuDevice(comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommGetAsyncError(comm, NULL), cfxInvalidArgument);
    cr_assert(strstr(cfxGetLastError(comm), "asyncError is NULL") != NULL, "%s",
              cfxGetLastError(comm));
    cr_assert_eq(cfxCommSplit(comm, 0, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(argcheck, negative_colors_other_than_nocolor_are_refused)
{
    cfxComm_t comm = solo(), child = NULL;
    cr_assert_eq(cfxCommSplit(comm, -7, 0, &child, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE("color = -7");
    cr_assert_null(child);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(argcheck, calls_after_finalize_are_invalid_usage)
{
    cfxComm_t comm = solo(), child = NULL;
    cr_assert_eq(cfxCommFinalize(comm), cfxSuccess);
    cr_assert_eq(cfxCommFinalize(comm), cfxInvalidUsage);
    ASSERT_SENTENCE("finalized");
    cr_assert_eq(cfxCommSplit(comm, 0, 0, &child, NULL), cfxInvalidUsage);
    int count;
    cr_assert_eq(cfxCommCount(comm, &count), cfxSuccess, "queries still work after finalize");
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(argcheck, a_successful_call_does_not_clear_the_process_sentence_of_an_earlier_failure)
{
    int version;
    cr_assert_eq(cfxGetVersion(NULL), cfxInvalidArgument);
    cr_assert_eq(cfxGetVersion(&version), cfxSuccess);
    ASSERT_SENTENCE("version is NULL");
}

/* Checks the collectives will use at their entry (internal, tested here). */
Test(argcheck, data_types_ops_roots_buffers_and_counts)
{
    cfxComm_t comm = solo();
    cr_assert_eq(cfx_argcheck_type(cfxBfloat16, "f"), cfxSuccess);
    cr_assert_eq(cfx_argcheck_type((cfxDataType_t)12, "f"), cfxInvalidArgument);
    ASSERT_SENTENCE("datatype 12");
    cr_assert_eq(cfx_argcheck_type((cfxDataType_t)-1, "f"), cfxInvalidArgument);
    cr_assert_eq(cfx_argcheck_op(cfxAvg, "f"), cfxSuccess);
    cr_assert_eq(cfx_argcheck_op((cfxRedOp_t)5, "f"), cfxInvalidArgument);
    ASSERT_SENTENCE("op 5");
    cr_assert_eq(cfx_argcheck_root(comm, 0, "f"), cfxSuccess);
    cr_assert_eq(cfx_argcheck_root(comm, 1, "f"), cfxInvalidArgument);
    ASSERT_SENTENCE("root = 1");
    cr_assert_eq(cfx_argcheck_root(comm, -1, "f"), cfxInvalidArgument);
    cr_assert_eq(cfx_argcheck_buffer(NULL, 0, "f", "sendbuff"), cfxSuccess);
    cr_assert_eq(cfx_argcheck_buffer(NULL, 3, "f", "sendbuff"), cfxInvalidArgument);
    ASSERT_SENTENCE("sendbuff is NULL but count is 3");
    cr_assert_eq(cfx_argcheck_count(SIZE_MAX / 2, cfxFloat32, 1, "f"), cfxInvalidArgument);
    ASSERT_SENTENCE("overflows");
    cr_assert_eq(cfx_argcheck_count((size_t)1 << 40, cfxFloat64, (size_t)1 << 30, "f"),
                 cfxInvalidArgument);
    cr_assert_eq(cfx_argcheck_count((size_t)1 << 20, cfxFloat64, 8, "f"), cfxSuccess);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}
