// Backend selection (--device) and the device-memory model behind the batch
// limit; the same in builds with and without CUDA (worker/cuda_backend.h).
#include <algorithm>
#include <string>

#include "worker/cpu_backend.h"
#include "worker/cuda_backend.h"

namespace pacer::worker {

size_t CudaBytesPerSample(const ModelSpec& spec) {
  size_t floats = static_cast<size_t>(spec.inputs()) + 2 * static_cast<size_t>(spec.classes());
  if (spec.kind == ModelSpec::Kind::kCnn) {
    const size_t c1 = static_cast<size_t>(spec.cnn.conv1), c2 = static_cast<size_t>(spec.cnn.conv2);
    const size_t p1 = kCnnImageSide * kCnnImageSide, p2 = p1 / 4, p3 = p2 / 4;
    const size_t k2 = kCnnKernel * kCnnKernel;
    floats += p1 * k2 + p1 * c1            // conv1 columns, output
              + 4 * p2 * c1                // pooled, its gradient, argmax, (ints: 4 bytes)
              + p2 * c1 * k2 + p2 * c2     // conv2 columns, output
              + 4 * p3 * c2 + 2 * p3 * c2  // pooled, gradient, argmax; flat and its gradient
              + p1;                        // the ones vector of the bias sums
  } else {
    const auto& l = spec.mlp.layers;
    size_t widest = 0;
    for (size_t k = 1; k < l.size(); ++k) {
      floats += static_cast<size_t>(l[k]);
      widest = std::max(widest, static_cast<size_t>(l[k]));
    }
    floats += std::max(widest, static_cast<size_t>(spec.inputs())) + 1;  // delta, ones
  }
  return floats * sizeof(float) + sizeof(double) + 1;  // + the per-row loss and label
}

size_t CudaBytesPerModel(const ModelSpec& spec) {
  size_t params = 0;
  for (const TensorSpec& t : ModelTensors(spec)) params += t.size;
  return 2 * params * sizeof(float);  // parameters and the packed gradient
}

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
