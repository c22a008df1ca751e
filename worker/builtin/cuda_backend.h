// The CUDA compute backend: the MLP and the CNN of worker/builtin/backend.h on a GPU,
// with cuBLAS GEMMs and our own kernels for bias, ReLU, pooling, im2col and
// softmax cross-entropy (worker/builtin/cuda_backend.cu). A build without CUDA
// (no nvcc, or -DPACER_ENABLE_CUDA=OFF) gets worker/builtin/cuda_none.cc instead,
// where there is no device and every call says why.
//
// Memory: parameters, gradients and activations stay on the device; the
// caller's flat vectors cross in one copy each way through pinned host
// staging buffers (the gradient of every tensor is packed contiguously on
// the device, so it leaves in one transfer).

#ifndef PACER_WORKER_BUILTIN_CUDA_BACKEND_H_
#define PACER_WORKER_BUILTIN_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/builtin/backend.h"

namespace pacer::worker {

struct CudaDevice {
  int index = 0;
  std::string name;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

// Whether this binary was built with the CUDA backend.
bool CudaBuilt();

// The CUDA devices usable here. Empty, with `why` saying so, when the build
// has no CUDA, no driver is loaded, or there is no GPU.
std::vector<CudaDevice> CudaDevices(std::string* why);

// The backend for `spec` on device `device`; nullptr with `why` when the
// spec is invalid or the device cannot be used.
std::unique_ptr<ComputeBackend> MakeCudaBackend(const ModelSpec& spec, int device,
                                                std::string* why);

// Kernels the CUDA backends of this process have run, as counted on the
// device itself (each kernel's first thread adds one to a device counter,
// read back here): the proof that the work ran on the GPU. 0 without CUDA.
uint64_t CudaKernelsRun();

// Device bytes one training sample of `spec` needs (activations, their
// gradients, im2col columns), beyond the per-model buffers: the worker
// divides free memory by it for the batch limit it reports (b_max).
size_t CudaBytesPerSample(const ModelSpec& spec);
// Device bytes of the per-model buffers (parameters, gradient, momentum-free
// copies) of `spec`.
size_t CudaBytesPerModel(const ModelSpec& spec);

// The CUDA entry points as one table: what libpacer_cuda.so (the backend
// built as a module) hands out through its C function PacerCudaApi, for a
// program that loads it with dlopen (worker/builtin/cuda_dl.cc) instead of linking
// cuBLAS at start.
struct CudaApi {
  bool (*built)();
  std::vector<CudaDevice> (*devices)(std::string* why);
  std::unique_ptr<ComputeBackend> (*make)(const ModelSpec& spec, int device, std::string* why);
  uint64_t (*kernels_run)();
};

// MakeBackend (--device) is in worker/builtin/device.h.

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_CUDA_BACKEND_H_
