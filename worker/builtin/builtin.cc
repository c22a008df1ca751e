#include "worker/builtin/builtin.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace pacer::worker {

BackendModel::BackendModel(std::unique_ptr<ComputeBackend> backend, std::string name)
    : backend_(std::move(backend)), name_(std::move(name)) {}

void BackendModel::Init(uint64_t seed, std::span<float> params) const {
  backend_->InitParams(seed, params);
}

const uint8_t* BackendModel::Labels(const Batch& batch) {
  labels_.resize(batch.labels.size());
  std::transform(batch.labels.begin(), batch.labels.end(), labels_.begin(),
                 [](uint32_t l) { return static_cast<uint8_t>(std::min<uint32_t>(l, 255)); });
  return labels_.data();
}

float BackendModel::ComputeGradient(std::span<const float> params, const Batch& batch,
                                    std::span<float> grad, GradientSink* sink) {
  if (batch.labels.size() != batch.size) return std::numeric_limits<float>::quiet_NaN();
  const uint8_t* y = Labels(batch);
  return backend_->ComputeGradient(params, batch.features.data(), y, static_cast<int>(batch.size),
                                   grad, sink);
}

EvalResult BackendModel::Evaluate(std::span<const float> params, const Batch& data) {
  if (data.labels.size() != data.size) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {nan, nan, 0};
  }
  const uint8_t* y = Labels(data);
  return backend_->Evaluate(params, data.features.data(), y, data.size);
}

void DatasetSource::Fill(std::span<const uint32_t> indices, Batch* batch) const {
  const size_t features = data_.features();
  batch->size = indices.size();
  batch->features.resize(indices.size() * features);
  batch->labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint32_t s = indices[i];
    std::memcpy(batch->features.data() + i * features,
                data_.images.data() + static_cast<size_t>(s) * features, features * sizeof(float));
    batch->labels[i] = data_.labels[s];
  }
}

Batch DatasetSource::First(size_t n) const {
  if (n == 0 || n > data_.size()) n = data_.size();
  Batch first;
  first.size = n;
  first.features.assign(data_.images.begin(),
                        data_.images.begin() + static_cast<std::ptrdiff_t>(n * data_.features()));
  first.labels.assign(data_.labels.begin(), data_.labels.begin() + static_cast<std::ptrdiff_t>(n));
  return first;
}

}  // namespace pacer::worker
