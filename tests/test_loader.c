/*
 * Libraries loaded at run time (src/util/verbs.c): libibverbs is dlopen'ed,
 * its symbols resolved at their versions, and a missing library or symbol
 * turns verbs off with a sentence instead of failing the process. Each test
 * runs in its own Criterion worker process, so each loads afresh.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cfx_build_config.h"
#include "src/util/param.h"
#include "src/util/verbs.h"

static void use_verbs_lib(const char *lib)
{
    setenv("CFX_IB_VERBS_LIB", lib, 1);
    cfx_param_reset_all();
    cfx_verbs_api_reset();
}

Test(verbs_loader, missing_library_turns_verbs_off_with_a_sentence)
{
    use_verbs_lib("/nonexistent/libibverbs.so.1");
    const char *why = NULL;
    cr_assert_null(cfx_verbs_api(&why));
    cr_assert_not_null(why);
#if CFX_HAVE_VERBS
    cr_assert(strstr(why, "cannot load /nonexistent/libibverbs.so.1") != NULL, "why: %s", why);
#else
    cr_assert(strstr(why, "without the verbs headers") != NULL, "why: %s", why);
#endif
}

Test(verbs_loader, library_without_the_versioned_symbols_is_refused)
{
#if !CFX_HAVE_VERBS
    cr_skip_test("built without the verbs headers");
#endif
    use_verbs_lib("libm.so.6"); /* Loads, but is no libibverbs. */
    const char *why = NULL;
    cr_assert_null(cfx_verbs_api(&why));
    cr_assert(strstr(why, "no ibv_get_device_list@IBVERBS_1.1") != NULL, "why: %s", why);
}

Test(verbs_loader, real_libibverbs_loads_and_lists_devices)
{
#if !CFX_HAVE_VERBS
    cr_skip_test("built without the verbs headers");
#endif
    void *probe = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (probe == NULL)
        cr_skip_test("libibverbs.so.1 is not installed here");
    dlclose(probe);
    use_verbs_lib("libibverbs.so.1");
    const char *why = NULL;
    const struct cfx_verbs_api *ibv = cfx_verbs_api(&why);
    cr_assert_not_null(ibv, "why: %s", why);
#if CFX_HAVE_VERBS
    /* A kernel without InfiniBand answers NULL (ENOSYS); with devices, a list. */
    int count = -1;
    errno = 0;
    struct ibv_device **list = ibv->get_device_list(&count);
    if (list == NULL)
        cr_assert(errno != 0, "NULL device list without errno");
    else
        ibv->free_device_list(list);
    cr_assert_not_null(ibv->wc_status_str);
    cr_assert_str_eq(ibv->wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
#endif
    /* Loaded once: the same table again. */
    cr_assert_eq(cfx_verbs_api(NULL), ibv);
}
