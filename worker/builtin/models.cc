// The built-in models' tables (worker/builtin/backend.h) and the CUDA
// batch-limit model.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "worker/builtin/backend.h"
#include "worker/builtin/cuda_backend.h"

namespace pacer::worker {

int ModelSpec::inputs() const {
  if (kind == Kind::kCnn) return kCnnImageSide * kCnnImageSide;
  return mlp.layers.empty() ? 0 : mlp.layers.front();
}

int ModelSpec::classes() const {
  if (kind == Kind::kCnn) return cnn.classes;
  return mlp.layers.empty() ? 0 : mlp.layers.back();
}

std::vector<TensorSpec> ModelTensors(const ModelSpec& spec) {
  std::vector<TensorSpec> t;
  if (spec.kind == ModelSpec::Kind::kCnn) {
    const CnnSpec& c = spec.cnn;
    if (c.conv1 <= 0 || c.conv2 <= 0 || c.classes <= 0) return {};
    const size_t k2 = kCnnKernel * kCnnKernel;
    const size_t c1 = static_cast<size_t>(c.conv1), c2 = static_cast<size_t>(c.conv2);
    const size_t flat = c2 * (kCnnImageSide / 4) * (kCnnImageSide / 4);
    t.push_back({"conv1.weight", c1 * k2, k2});
    t.push_back({"conv1.bias", c1, 0});
    t.push_back({"conv2.weight", c2 * c1 * k2, c1 * k2});
    t.push_back({"conv2.bias", c2, 0});
    t.push_back({"fc.weight", static_cast<size_t>(c.classes) * flat, flat});
    t.push_back({"fc.bias", static_cast<size_t>(c.classes), 0});
    return t;
  }
  const std::vector<int>& layers = spec.mlp.layers;
  if (layers.size() < 2) return {};
  for (int width : layers) {
    if (width <= 0) return {};
  }
  for (size_t k = 1; k < layers.size(); ++k) {
    const size_t in = static_cast<size_t>(layers[k - 1]), out = static_cast<size_t>(layers[k]);
    const std::string prefix = "fc" + std::to_string(k);
    t.push_back({prefix + ".weight", out * in, in});
    t.push_back({prefix + ".bias", out, 0});
  }
  return t;
}

// The device-memory model behind a GPU worker's batch limit
// (worker/builtin/cuda_backend.h); here so that the CUDA module has it too.
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

std::shared_ptr<float> ComputeBackend::AllocateHost(size_t floats) { return AllocateZeroed(floats); }

}  // namespace pacer::worker
