// Backend selection (--device); the same in builds with and without CUDA
// (worker/cuda_backend.h).
#include <algorithm>
#include <string>

#include "worker/cpu_backend.h"
#include "worker/cuda_backend.h"

namespace pacer::worker {

std::unique_ptr<ComputeBackend> MakeBackend(const ModelSpec& spec, const std::string& device,
                                            std::string* why) {
  if (device == "cpu") {
    auto b = MakeCpuBackend(spec);
    if (b == nullptr && why != nullptr) *why = "invalid model shape";
    return b;
  }
  if (device == "auto") {
    std::string none;
    if (!CudaDevices(&none).empty()) return MakeCudaBackend(spec, 0, why);
    auto b = MakeCpuBackend(spec);
    if (b == nullptr && why != nullptr) *why = "invalid model shape";
    return b;
  }
  int index = 0;
  if (device == "cuda") {
    index = 0;
  } else if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
             device.find_first_not_of("0123456789", 5) == std::string::npos && device.size() < 9) {
    index = std::stoi(device.substr(5));
  } else {
    if (why != nullptr) *why = "--device: '" + device + "' is not cpu, cuda, cuda:N or auto";
    return nullptr;
  }
  return MakeCudaBackend(spec, index, why);
}

}  // namespace pacer::worker
