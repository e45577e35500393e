# Resolves the AUTO options into CFX_HAVE_* with a printed note each, and
# finds the required libraries. A missing dependency names its Debian
# package and scripts/deps.sh (which installs them all).

# cfx_resolve_option(<CFX_WITH_x> <found> <what> <package>): <found> is a
# boolean (quote it: an empty variable is FALSE), <package> the Debian
# package that provides <what>.
function(cfx_resolve_option opt found what package)
  if(${opt} STREQUAL "OFF")
    set(result OFF)
    message(STATUS "Conflux: ${what} disabled (${opt}=OFF)")
  elseif(found)
    set(result ON)
    message(STATUS "Conflux: ${what} enabled")
  elseif(${opt} STREQUAL "ON")
    message(FATAL_ERROR "Conflux: ${opt}=ON but ${what} was not found; install ${package} "
      "(scripts/deps.sh installs every dependency) or set ${opt}=AUTO")
  else()
    set(result OFF)
    message(STATUS "Conflux: ${what} not found, building without it (${opt}=AUTO; "
      "install ${package} or run scripts/deps.sh to have it)")
  endif()
  string(REPLACE "CFX_WITH_" "CFX_HAVE_" have ${opt})
  set(${have} ${result} PARENT_SCOPE)
endfunction()

# CUDA: the kernels compile with nvcc even where no GPU can run them.
set(cuda_found FALSE)
if(NOT CFX_WITH_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    set(cuda_found ${CUDAToolkit_FOUND})
  endif()
endif()
cfx_resolve_option(CFX_WITH_CUDA "${cuda_found}" "CUDA" "the CUDA toolkit (nvidia-cuda-toolkit)")

find_package(PkgConfig QUIET)
if(NOT PkgConfig_FOUND)
  message(FATAL_ERROR "Conflux: pkg-config was not found; install pkg-config "
    "(scripts/deps.sh installs every dependency)")
endif()

# libxml2 reads and writes NCCL topology files (src/topo): required.
pkg_check_modules(LIBXML2 QUIET IMPORTED_TARGET libxml-2.0)
if(NOT LIBXML2_FOUND)
  message(FATAL_ERROR "Conflux: libxml2 (pkg-config module libxml-2.0) was not found; install "
    "libxml2-dev (scripts/deps.sh installs every dependency)")
endif()

set(verbs_found FALSE)
if(NOT CFX_WITH_VERBS STREQUAL "OFF")
  find_library(IBVERBS_LIBRARY ibverbs)
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  if(IBVERBS_LIBRARY AND IBVERBS_INCLUDE_DIR)
    set(verbs_found TRUE)
  endif()
endif()
cfx_resolve_option(CFX_WITH_VERBS "${verbs_found}" "verbs (libibverbs)" libibverbs-dev)

set(hwloc_found FALSE)
if(NOT CFX_WITH_HWLOC STREQUAL "OFF")
  pkg_check_modules(HWLOC QUIET IMPORTED_TARGET hwloc)
  set(hwloc_found "${HWLOC_FOUND}")
endif()
cfx_resolve_option(CFX_WITH_HWLOC "${hwloc_found}" "hwloc" libhwloc-dev)
