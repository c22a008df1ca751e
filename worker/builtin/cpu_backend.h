// CPU implementations of ComputeBackend: the MLP and the CNN on Eigen, with
// the matrix products handed to OpenBLAS.

#ifndef PACER_WORKER_BUILTIN_CPU_BACKEND_H_
#define PACER_WORKER_BUILTIN_CPU_BACKEND_H_

#include <memory>

#include "worker/builtin/backend.h"

namespace pacer::worker {

// Creates a CPU backend for the MLP `spec`. Returns nullptr if the spec is
// invalid (fewer than two layers, or a width <= 0). The caller owns the result.
//
// Side effect: pins OpenBLAS to one thread for the whole process
// (openblas_set_num_threads(1)), because the worker parallelizes across
// workers, not within a GEMM. Calls from different threads on different
// instances are safe.
std::unique_ptr<ComputeBackend> MakeCpuBackend(const MlpSpec& spec);

// The CNN of `spec` on the CPU (worker/builtin/cpu_cnn.cc): im2col plus OpenBLAS
// GEMMs, a batch processed in chunks of 64 samples so that its scratch
// stays under ~60 MB. nullptr when a count is <= 0.
std::unique_ptr<ComputeBackend> MakeCpuCnnBackend(const CnnSpec& spec);

// Either model.
std::unique_ptr<ComputeBackend> MakeCpuBackend(const ModelSpec& spec);

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_CPU_BACKEND_H_
