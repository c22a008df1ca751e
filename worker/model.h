// What a worker trains, as the training runtime (worker/trainer.h) sees it:
// a Model (its tensor table, init, gradient, evaluation) and a DataSource
// (samples by index). The built-in models and Fashion-MNIST implement them
// in worker/builtin/; a program of its own brings its own (the installed
// example: logistic regression over a CSV file).
//
// The parameter server only ever sees the model's flat parameter vector:
// its tensors end to end, in the order of tensors(), each cut into keys.
#ifndef PACER_WORKER_MODEL_H_
#define PACER_WORKER_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pacer::worker {

// One named tensor of the flat parameter vector.
struct TensorSpec {
  std::string name;  // "fc1.weight", "fc1.bias", "conv1.weight", ...
  size_t size;       // Number of floats, e.g. 256 * 784 for fc1.weight.
  // A weight's inputs per output (its init bound is sqrt(6 / fan_in)); 0
  // for a bias (initialised to zero).
  size_t fan_in = 0;
};

// The initialisation every backend uses (so that they start from the same
// bytes): element i of a weight tensor is u_i * sqrt(6 / fan_in), u_i in
// [-1, 1) from the i-th output of splitmix64 seeded with `seed` (i: the
// index in the whole flat vector; 24 random bits, exactly representable);
// biases are zero. NaN everywhere when params.size() differs from the sum
// of `tensors`' sizes.
void InitTensors(const std::vector<TensorSpec>& tensors, uint64_t seed, std::span<float> params);

// A range [begin, end) of the flat parameter (and gradient) vector.
struct GradRange {
  size_t begin = 0;
  size_t end = 0;
};

// The gradient's ranges in the order a backward pass finishes them: one per
// layer (the tensors that share a name before the '.', such as fc2.weight
// and fc2.bias), the last layer first.
std::vector<GradRange> BackwardStages(const std::vector<TensorSpec>& tensors);

// Told during Model::ComputeGradient as each stage of the gradient (see
// BackwardStages) becomes final, so that the caller can send it while the
// rest is still computed.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // grad's range of stage `stage` holds its final values and is not written
  // again in this call. Called in stage order, each stage once, from the
  // thread that called ComputeGradient; not called when it fails.
  virtual void Ready(size_t stage) = 0;
};

// Result of Model::Evaluate (and ComputeBackend::Evaluate).
struct EvalResult {
  double accuracy = 0;  // Fraction of samples right (a classifier: argmax logit == label).
  double loss = 0;      // Mean loss (the built-in models: cross-entropy, natural log).
  size_t samples = 0;   // Number of samples evaluated.
};

// `floats` zeroed floats of ordinary memory (at least one); null when they
// cannot be had.
std::shared_ptr<float> AllocateZeroed(size_t floats);

// A batch of samples as a DataSource fills it for a Model: `size` samples,
// each `features.size() / size` floats (sample-major) and one label. What
// the numbers mean is between the two; the runtime never looks.
struct Batch {
  size_t size = 0;
  std::vector<float> features;
  std::vector<uint32_t> labels;
};

// Training (or test) data, read by sample index: the monitor hands out
// partitions of [0, size()) and read positions in them, and a batch is the
// samples at some of those indices.
class DataSource {
 public:
  virtual ~DataSource() = default;
  // Samples in the set; the same on every worker of a job.
  virtual size_t size() const = 0;
  // Fills `batch` with the samples `indices` (each < size()) in that
  // order, reusing its memory.
  virtual void Fill(std::span<const uint32_t> indices, Batch* batch) const = 0;
};

// What a worker trains. The runtime needs its tensors (the keys it
// declares), Init (when this worker sets the model) and, for the host
// buffers, AllocateHost; a training loop calls ComputeGradient and
// Evaluate. One instance is used from one thread at a time.
class Model {
 public:
  virtual ~Model() = default;
  // For logs: "mlp", "cnn", "logistic", ...
  virtual std::string name() const = 0;
  // The tensors, in flat-vector order; names must be unique (parameter
  // groups match them). The reference stays valid for the model's life.
  virtual const std::vector<TensorSpec>& tensors() const = 0;
  size_t num_params() const;
  // The parameters to start from, deterministic in `seed` (the first
  // worker of a job sets the shards' model with them).
  virtual void Init(uint64_t seed, std::span<float> params) const = 0;
  // The gradient of the batch-MEAN loss over `batch` into `grad`
  // (num_params() floats, overwritten), telling `sink` (may be null) as
  // each of stages() is final, in order; returns the mean loss. NaN on bad
  // arguments (then grad is unspecified and the sink told nothing). The
  // shards weight each worker's gradient by its batch: a sum-reduced loss
  // would count big batches twice.
  virtual float ComputeGradient(std::span<const float> params, const Batch& batch,
                                std::span<float> grad, GradientSink* sink) = 0;
  // Accuracy and mean loss over `data`.
  virtual EvalResult Evaluate(std::span<const float> params, const Batch& data) = 0;
  // The gradient's ranges in the order ComputeGradient finishes them (the
  // layer-wise push sends each as it is told); default: BackwardStages.
  virtual std::vector<GradRange> stages() const { return BackwardStages(tensors()); }
  // Whether ComputeGradient queues work on a device and tells the sink as
  // copies land, rather than computing each stage on the calling thread.
  virtual bool asynchronous() const { return false; }
  // The largest batch one pass holds (reported as this worker's memory
  // limit); 0: none.
  virtual uint32_t max_batch() const { return 0; }
  // Host memory for `floats` zeroed values that parameters are copied from
  // and gradients to fastest (page-locked for a GPU); null when none can be
  // had. Default: ordinary memory.
  virtual std::shared_ptr<float> AllocateHost(size_t floats);
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_MODEL_H_
