// The CUDA entry points of worker/builtin/cuda_backend.h for a program without the
// CUDA backend (a build without nvcc or with -DPACER_ENABLE_CUDA=OFF):
// there is no device, and each call says so.
#include "worker/builtin/cuda_backend.h"

namespace pacer::worker {

namespace {
constexpr const char* kWhy = "this program has no CUDA backend (a build without nvcc or "
                             "with -DPACER_ENABLE_CUDA=OFF)";
}  // namespace

bool CudaBuilt() { return false; }

std::vector<CudaDevice> CudaDevices(std::string* why) {
  if (why != nullptr) *why = kWhy;
  return {};
}

std::unique_ptr<ComputeBackend> MakeCudaBackend(const ModelSpec&, int, std::string* why) {
  if (why != nullptr) *why = kWhy;
  return nullptr;
}

uint64_t CudaKernelsRun() { return 0; }

}  // namespace pacer::worker
