/*
 * torch_conflux._C: the Python face of ProcessGroupConflux. The package's
 * __init__.py registers create_process_group as the "conflux" backend.
 */
#include "process_group_conflux.hpp"

#include <pybind11/chrono.h>
#include <torch/python.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "Conflux process group for torch.distributed (CPU tensors)";
  m.def("create_process_group", &cfx_torch::ProcessGroupConflux::create, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        "Joins the Conflux communicator of a group through its c10d store.",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
