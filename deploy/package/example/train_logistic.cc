// Trains a model of your own with Pacer: multinomial logistic regression
// over a CSV file, as one worker of a running job. The program brings the
// model (pacer::worker::Model: its tensors, init, gradient, evaluation) and
// the data (pacer::worker::DataSource: samples by index); Pacer's training
// runtime (pacer::worker::Trainer) brings the rest: registration, the batch
// size the monitor assigns, the data partitions and read positions, pulls
// and pushes, staleness, the stop.
//
//   train_logistic tcp://MONITOR:PORT blobs.csv
//
// The CSV has one sample per line: features, then the class (0, 1, ...);
// lines starting with '#' and a header line are skipped. Every worker of a
// job must read the same file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/transport.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace {

using pacer::worker::Batch;
using pacer::worker::EvalResult;
using pacer::worker::GradientSink;
using pacer::worker::TensorSpec;

// The samples of a CSV file, in memory.
class CsvData final : public pacer::worker::DataSource {
 public:
  static absl::StatusOr<CsvData> Read(const std::string& path) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError("cannot open " + path);
    CsvData d;
    size_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.empty() || line[0] == '#') continue;
      std::vector<float> values;
      std::stringstream ss(line);
      bool numeric = true;
      for (std::string cell; std::getline(ss, cell, ',');) {
        char* end = nullptr;
        const float v = std::strtof(cell.c_str(), &end);
        if (end == cell.c_str() || *end != '\0' || !std::isfinite(v)) numeric = false;
        values.push_back(v);
      }
      if (!numeric && d.labels_.empty()) continue;  // the header
      const std::string where = path + ":" + std::to_string(line_no);
      if (!numeric || values.size() < 2) {
        return absl::InvalidArgumentError(where + ": want numbers: features, then the class");
      }
      const float label = values.back();
      if (label < 0 || label != std::floor(label) || label > 1e6f) {
        return absl::InvalidArgumentError(where + ": the class must be 0, 1, 2, ...");
      }
      values.pop_back();
      if (d.features_ == 0) d.features_ = values.size();
      if (values.size() != d.features_) {
        return absl::InvalidArgumentError(where + ": " + std::to_string(values.size()) +
                                          " features, the first sample has " +
                                          std::to_string(d.features_));
      }
      d.x_.insert(d.x_.end(), values.begin(), values.end());
      d.labels_.push_back(static_cast<uint32_t>(label));
      d.classes_ = std::max<size_t>(d.classes_, d.labels_.back() + 1);
    }
    if (d.labels_.empty()) return absl::InvalidArgumentError(path + ": no samples");
    return d;
  }

  size_t size() const override { return labels_.size(); }
  void Fill(std::span<const uint32_t> indices, Batch* batch) const override {
    batch->size = indices.size();
    batch->features.resize(indices.size() * features_);
    batch->labels.resize(indices.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      std::copy_n(x_.begin() + static_cast<std::ptrdiff_t>(indices[i] * features_), features_,
                  batch->features.begin() + static_cast<std::ptrdiff_t>(i * features_));
      batch->labels[i] = labels_[indices[i]];
    }
  }
  size_t features() const { return features_; }
  size_t classes() const { return classes_; }

 private:
  size_t features_ = 0, classes_ = 0;
  std::vector<float> x_;
  std::vector<uint32_t> labels_;
};

// Softmax regression: logits = W x + b, mean cross-entropy over the batch.
class Logistic final : public pacer::worker::Model {
 public:
  Logistic(size_t features, size_t classes)
      : features_(features), classes_(classes),
        tensors_{{"linear.weight", classes * features, features}, {"linear.bias", classes, 0}} {}

  std::string name() const override { return "logistic"; }
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  void Init(uint64_t seed, std::span<float> params) const override {
    pacer::worker::InitTensors(tensors_, seed, params);
  }

  float ComputeGradient(std::span<const float> params, const Batch& batch, std::span<float> grad,
                        GradientSink* sink) override {
    if (batch.size == 0 || params.size() != num_params() || grad.size() != num_params()) {
      return std::numeric_limits<float>::quiet_NaN();
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    float* gw = grad.data();
    float* gb = grad.data() + classes_ * features_;
    double loss = 0;
    const float scale = 1.0f / static_cast<float>(batch.size);
    for (size_t i = 0; i < batch.size; ++i) {
      const float* x = batch.features.data() + i * features_;
      const std::vector<float>& p = Softmax(params, x);
      const uint32_t y = batch.labels[i];
      if (y >= classes_) return std::numeric_limits<float>::quiet_NaN();
      loss -= std::log(std::max(p[y], 1e-30f));
      for (size_t c = 0; c < classes_; ++c) {
        const float d = (p[c] - (c == y ? 1.0f : 0.0f)) * scale;  // dloss/dlogit, batch-mean
        for (size_t f = 0; f < features_; ++f) gw[c * features_ + f] += d * x[f];
        gb[c] += d;
      }
    }
    if (sink != nullptr) sink->Ready(0);  // one layer, one stage
    return static_cast<float>(loss / static_cast<double>(batch.size));
  }

  EvalResult Evaluate(std::span<const float> params, const Batch& data) override {
    EvalResult r;
    double loss = 0;
    size_t right = 0;
    for (size_t i = 0; i < data.size; ++i) {
      const std::vector<float>& p = Softmax(params, data.features.data() + i * features_);
      const uint32_t y = std::min<uint32_t>(data.labels[i], static_cast<uint32_t>(classes_ - 1));
      loss -= std::log(std::max(p[y], 1e-30f));
      right += std::max_element(p.begin(), p.end()) - p.begin() == y;
    }
    r.samples = data.size;
    r.accuracy = data.size ? static_cast<double>(right) / static_cast<double>(data.size) : 0;
    r.loss = data.size ? loss / static_cast<double>(data.size) : 0;
    return r;
  }

 private:
  // The class probabilities of one sample.
  const std::vector<float>& Softmax(std::span<const float> params, const float* x) {
    probs_.assign(classes_, 0.0f);
    const float* w = params.data();
    const float* b = params.data() + classes_ * features_;
    for (size_t c = 0; c < classes_; ++c) {
      float z = b[c];
      for (size_t f = 0; f < features_; ++f) z += w[c * features_ + f] * x[f];
      probs_[c] = z;
    }
    const float top = *std::max_element(probs_.begin(), probs_.end());
    float sum = 0;
    for (float& z : probs_) sum += (z = std::exp(z - top));
    for (float& z : probs_) z /= sum;
    return probs_;
  }

  size_t features_, classes_;
  std::vector<TensorSpec> tensors_;
  std::vector<float> probs_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s tcp://MONITOR:PORT DATA.csv\n", argv[0]);
    return 2;
  }
  auto data = CsvData::Read(argv[2]);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 2;
  }
  Logistic model(data->features(), data->classes());
  // The monitor asks one worker to evaluate now and then: here, on the
  // whole file, with a model instance of its own (it runs on its own thread).
  Logistic eval_model(data->features(), data->classes());
  std::vector<uint32_t> every(data->size());
  for (uint32_t i = 0; i < every.size(); ++i) every[i] = i;
  Batch all;
  data->Fill(every, &all);

  pacer::worker::TrainerOptions options;
  options.monitor = argv[1];
  options.evaluate = [&](std::span<const float> params) -> absl::StatusOr<EvalResult> {
    return eval_model.Evaluate(params, all);
  };
  auto transport = pacer::MakeZmqTransport(pacer::TransportOptions{});
  pacer::worker::Trainer trainer(transport.get(), options);
  if (absl::Status s = trainer.Start(&model, data->size()); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  Batch batch;
  while (auto plan = trainer.NextBatch()) {
    // The batch: the samples the monitor's read position and batch size say.
    if (!trainer.Pull([&] { data->Fill(plan->samples, &batch); }).ok()) break;
    GradientSink* sink = trainer.StartPush();
    const float loss =
        plan->samples.empty() ? 0.0f
                              : model.ComputeGradient(trainer.params(), batch, trainer.grads(), sink);
    if (!trainer.FinishPush(loss).ok()) break;
    if (plan->clock % 100 == 0) {
      std::printf("clock %lu: batch %zu, loss %.4f\n", static_cast<unsigned long>(plan->clock),
                  plan->samples.size(), loss);
    }
  }
  auto result = trainer.Finish();
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
    return 1;
  }
  const EvalResult end = eval_model.Evaluate(trainer.params(), all);
  std::printf("rank %u trained %lu samples in %lu clocks (%s); accuracy %.4f on %s\n",
              result->rank, static_cast<unsigned long>(result->samples),
              static_cast<unsigned long>(result->clocks), result->stop_reason.c_str(),
              end.accuracy, argv[2]);
  return 0;
}
