// Backend selection by name (--device), the same in builds with and
// without CUDA; defined in device.cc, which each CUDA variant library
// (worker/builtin/compute.cmake) compiles with its own backend. Apart from
// worker/builtin/cuda_backend.h because that header is compiled by nvcc too.
#ifndef PACER_WORKER_BUILTIN_DEVICE_H_
#define PACER_WORKER_BUILTIN_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/builtin/backend.h"

namespace pacer::worker {

// The backend named by --device: "cpu", "cuda" or "cuda:N", or "auto"
// (cuda:0 where a GPU exists, else cpu). InvalidArgument, saying why, for
// a bad name, a bad model shape or a CUDA device that cannot be used (never
// a silent CPU fallback).
[[nodiscard]] absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(
    const ModelSpec& spec, const std::string& device);

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_DEVICE_H_
