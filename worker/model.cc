// The model interfaces' shared pieces: the initialisation and the backward
// stages (worker/model.h).
#include "worker/model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <new>

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

size_t Model::num_params() const {
  size_t n = 0;
  for (const TensorSpec& t : tensors()) n += t.size;
  return n;
}

std::shared_ptr<float> AllocateZeroed(size_t floats) {
  return std::shared_ptr<float>(new (std::nothrow) float[std::max<size_t>(1, floats)](),
                                std::default_delete<float[]>());
}

std::shared_ptr<float> Model::AllocateHost(size_t floats) { return AllocateZeroed(floats); }

}  // namespace pacer::worker
