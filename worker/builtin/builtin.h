// The built-in models and data as the training runtime's interfaces
// (worker/model.h): a ComputeBackend (the MLP or the CNN, on the CPU or a
// CUDA GPU) as a Model, and a Dataset (Fashion-MNIST) as a DataSource.
// pacer-worker trains these.
#ifndef PACER_WORKER_BUILTIN_BUILTIN_H_
#define PACER_WORKER_BUILTIN_BUILTIN_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/builtin/backend.h"
#include "worker/builtin/mnist.h"
#include "worker/model.h"

namespace pacer::worker {

// A compute backend as a Model: labels are class indices, features the
// backend's inputs (784 pixels for Fashion-MNIST).
class BackendModel final : public Model {
 public:
  // `name` for logs: "mlp", "cnn".
  BackendModel(std::unique_ptr<ComputeBackend> backend, std::string name);
  std::string name() const override { return name_; }
  const std::vector<TensorSpec>& tensors() const override { return backend_->tensors(); }
  void Init(uint64_t seed, std::span<float> params) const override;
  float ComputeGradient(std::span<const float> params, const Batch& batch, std::span<float> grad,
                        GradientSink* sink) override;
  EvalResult Evaluate(std::span<const float> params, const Batch& data) override;
  bool asynchronous() const override { return backend_->asynchronous(); }
  uint32_t max_batch() const override { return backend_->max_batch(); }
  std::shared_ptr<float> AllocateHost(size_t floats) override {
    return backend_->AllocateHost(floats);
  }
  ComputeBackend& backend() { return *backend_; }

 private:
  // The labels as the backend takes them (bytes); a label past 255 reads
  // as 255, which the backends refuse (NaN) when it is not a class.
  const uint8_t* Labels(const Batch& batch);
  std::unique_ptr<ComputeBackend> backend_;
  std::string name_;
  std::vector<uint8_t> labels_;
};

// A labelled image set (worker/builtin/mnist.h) as a DataSource: features
// are the pixels, labels the classes.
class DatasetSource final : public DataSource {
 public:
  explicit DatasetSource(Dataset data) : data_(std::move(data)) {}
  size_t size() const override { return data_.size(); }
  void Fill(std::span<const uint32_t> indices, Batch* batch) const override;
  // The first `n` samples in order (0, or more than there are: all), such
  // as the test set for an evaluation.
  Batch First(size_t n) const;
  const Dataset& data() const { return data_; }

 private:
  Dataset data_;
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_BUILTIN_H_
