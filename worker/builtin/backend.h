// The compute-backend interface: forward/backward passes of the worker's model
// over a flat parameter vector. Implementations: CPU (worker/builtin/cpu_backend.h),
// CUDA (later). The parameter server only ever sees the flat vector; the
// tensor table below says how it is cut into tensors.

#ifndef PACER_WORKER_BUILTIN_BACKEND_H_
#define PACER_WORKER_BUILTIN_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/model.h"

namespace pacer::worker {

// Shape of a multi-layer perceptron: layers[0] inputs, layers.back() classes,
// fully connected layers in between with ReLU on every hidden layer and a
// softmax cross-entropy loss on the output. At least two entries, all > 0.
struct MlpSpec {
  std::vector<int> layers = {784, 256, 128, 10};
};

// A small CNN for Fashion-MNIST's 28x28 one-channel images:
//   conv1: conv1 filters 5x5, padding 2 (28x28), ReLU, 2x2 max pool (14x14)
//   conv2: conv2 filters 5x5 over conv1 channels, padding 2, ReLU, 2x2 max
//          pool (7x7)
//   fc:    conv2 * 7 * 7 inputs (flattened channel-major, as PyTorch's
//          Flatten of NCHW) to `classes` logits; softmax cross-entropy.
// Parameter layout: conv1.weight (conv1 x 1 x 5 x 5, PyTorch's OIHW),
// conv1.bias, conv2.weight (conv2 x conv1 x 5 x 5), conv2.bias, fc.weight
// (classes x conv2*49, row-major), fc.bias.
struct CnnSpec {
  int conv1 = 16;
  int conv2 = 32;
  int classes = 10;
};
inline constexpr int kCnnImageSide = 28;
inline constexpr int kCnnKernel = 5;

// Which model a worker trains.
struct ModelSpec {
  enum class Kind { kMlp, kCnn };
  Kind kind = Kind::kMlp;
  MlpSpec mlp;
  CnnSpec cnn;
  // "mlp" or "cnn".
  std::string name() const { return kind == Kind::kCnn ? "cnn" : "mlp"; }
  // Features per sample, and classes.
  int inputs() const;
  int classes() const;
};

// The tensor table of `spec`, in flat-vector order; empty when the spec is
// invalid (an MLP with fewer than two layers or a width <= 0; a CNN with a
// count <= 0).
std::vector<TensorSpec> ModelTensors(const ModelSpec& spec);

// A model plus the hardware that runs it.
//
// Parameter layout: for layer k = 1..L (L = layers.size() - 1) the flat vector
// holds "fck.weight" (out x in floats, row-major: element (o, i) at o * in + i,
// i.e. PyTorch's nn.Linear layout) followed by "fck.bias" (out floats).
//
// Thread-safety: const methods may be called concurrently. ComputeGradient and
// Evaluate use per-instance scratch buffers, so one instance must not run them
// from two threads at once; use one instance per thread.
//
// Failure: nothing throws. Argument errors (spans of the wrong size, batch or
// n inconsistent, labels >= the number of classes) are caller bugs and are
// reported with NaN results as documented per method, never by aborting.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // A short name for logs and metrics: "cpu", "cuda".
  virtual std::string name() const = 0;

  // The model's tensors in the order they are laid out in the flat parameter
  // (and gradient) vector. Sum of sizes == num_params(). The reference stays
  // valid for the life of the backend.
  virtual const std::vector<TensorSpec>& tensors() const = 0;

  // Total number of floats in the flat parameter vector.
  virtual size_t num_params() const = 0;

  // Fills `params` (caller-owned, num_params() floats) with a deterministic
  // initialization derived from `seed` alone: weights uniform in
  // [-sqrt(6 / fan_in), sqrt(6 / fan_in)] (Kaiming-uniform for ReLU), biases
  // zero. The same seed and spec give the same bytes on every platform (the
  // generator is specified, not std::*_distribution). If params.size() !=
  // num_params(), fills params with NaN.
  virtual void InitParams(uint64_t seed, std::span<float> params) const = 0;

  // Forward and backward pass over one batch.
  //   params: num_params() floats, read only.
  //   x:      batch * layers[0] floats, sample-major (sample b's features at
  //           x[b * layers[0]]).
  //   y:      batch labels in [0, classes).
  //   grad:   num_params() floats, overwritten (not accumulated) with the
  //           gradient of the batch-MEAN cross-entropy loss, same layout as
  //           params.
  // Returns the mean loss over the batch. All buffers are caller-owned and
  // only used during the call; grad must not overlap params, x or y.
  // On bad arguments (batch <= 0, wrong span sizes, null x/y, a label out of
  // range) returns NaN and leaves grad unspecified.
  // Scratch memory is reused across calls: after the first call at a given
  // batch size no large allocations happen.
  //
  // sink (may be null) is told as each stage of grad is final, in
  // BackwardStages(tensors()) order.
  virtual float ComputeGradient(std::span<const float> params, const float* x,
                                const uint8_t* y, int batch, std::span<float> grad,
                                GradientSink* sink) = 0;
  float ComputeGradient(std::span<const float> params, const float* x, const uint8_t* y,
                        int batch, std::span<float> grad) {
    return ComputeGradient(params, x, y, batch, grad, nullptr);
  }

  // Accuracy and mean loss over n samples (x: n * layers[0] floats, y: n
  // labels), evaluated in fixed-size chunks so memory stays bounded for any n.
  // n == 0 gives {0, 0, 0}. On bad arguments (wrong params size, null x/y
  // with n > 0, a label out of range) returns accuracy and loss NaN and
  // samples 0.
  virtual EvalResult Evaluate(std::span<const float> params, const float* x,
                              const uint8_t* y, size_t n) = 0;

  // The largest batch this backend's memory holds in one pass (a GPU's free
  // memory over the model's per-sample footprint), which the worker reports
  // to the policy as b_max; 0: no such limit (the CPU backends, which work
  // in fixed chunks).
  virtual uint32_t max_batch() const { return 0; }

  // Whether ComputeGradient queues its work on a device and reports stages
  // as their copies land (CUDA) rather than computing each on the calling
  // thread: time between two reports is then not that stage's compute.
  virtual bool asynchronous() const { return false; }

  // Host memory for `floats` values (zeroed) that this backend copies
  // parameters from and gradients to fastest: page-locked memory for a GPU
  // (copied by DMA, asynchronously), ordinary memory for the CPU. Null
  // when it cannot be had. The memory may outlive the backend.
  virtual std::shared_ptr<float> AllocateHost(size_t floats);
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_BACKEND_H_
