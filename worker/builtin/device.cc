// Backend selection (--device); the same in builds with and without CUDA
// (worker/builtin/cuda_backend.h).
#include "worker/builtin/device.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/builtin/cpu_backend.h"
#include "worker/builtin/cuda_backend.h"

namespace pacer::worker {

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend(const ModelSpec& spec,
                                                           const std::string& device) {
  auto cpu = [&]() -> absl::StatusOr<std::unique_ptr<ComputeBackend>> {
    auto b = MakeCpuBackend(spec);
    if (b == nullptr) return absl::InvalidArgumentError("invalid model shape");
    return b;
  };
  auto cuda = [&](int index) -> absl::StatusOr<std::unique_ptr<ComputeBackend>> {
    std::string why;
    auto b = MakeCudaBackend(spec, index, &why);
    if (b == nullptr) return absl::InvalidArgumentError(why);
    return b;
  };
  if (device == "cpu") return cpu();
  if (device == "auto") {
    std::string none;
    return CudaDevices(&none).empty() ? cpu() : cuda(0);
  }
  if (device == "cuda") return cuda(0);
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos && device.size() < 9) {
    return cuda(std::stoi(device.substr(5)));
  }
  return absl::InvalidArgumentError("--device: '" + device +
                                    "' is not cpu, cuda, cuda:N or auto");
}

}  // namespace pacer::worker
