// Model tables and the initialisation shared by every compute backend
// (worker/backend.h).
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

#include "worker/backend.h"
#include "worker/cuda_backend.h"

namespace pacer::worker {
namespace {

// splitmix64's output function. Element i of the init stream is
// Mix(seed + (i + 1) * golden), i.e. the i-th output of a splitmix64 generator
// seeded with `seed`; being counter-based, another backend can compute any
// element independently (e.g. one GPU thread each) and get the same bits.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

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

void InitTensors(const std::vector<TensorSpec>& tensors, uint64_t seed, std::span<float> params) {
  size_t total = 0;
  for (const TensorSpec& t : tensors) total += t.size;
  if (params.size() != total) {
    std::fill(params.begin(), params.end(), std::numeric_limits<float>::quiet_NaN());
    return;
  }
  size_t i = 0;
  for (const TensorSpec& t : tensors) {
    if (t.fan_in == 0) {
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(i), t.size, 0.0f);
      i += t.size;
      continue;
    }
    const double bound = std::sqrt(6.0 / static_cast<double>(t.fan_in));
    for (const size_t end = i + t.size; i < end; ++i) {
      // 24 random bits -> an exactly representable u in [-1, 1).
      const uint64_t bits = Mix(seed + (i + 1) * 0x9e3779b97f4a7c15ULL) >> 40;
      const double u = static_cast<double>(bits) * 0x1p-23 - 1.0;
      params[i] = static_cast<float>(u * bound);
    }
  }
}

// The device-memory model behind a GPU worker's batch limit
// (worker/cuda_backend.h); here so that the CUDA module has it too.
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

std::vector<GradRange> BackwardStages(const std::vector<TensorSpec>& tensors) {
  std::vector<GradRange> forward;
  std::string layer;
  size_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const std::string prefix = t.name.substr(0, t.name.find('.'));
    if (forward.empty() || prefix != layer) {
      forward.push_back({offset, offset});
      layer = prefix;
    }
    offset += t.size;
    forward.back().end = offset;
  }
  return {forward.rbegin(), forward.rend()};
}

std::shared_ptr<float> ComputeBackend::AllocateHost(size_t floats) {
  return std::shared_ptr<float>(new (std::nothrow) float[std::max<size_t>(1, floats)](),
                                std::default_delete<float[]>());
}

}  // namespace pacer::worker
