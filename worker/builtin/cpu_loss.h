// The softmax cross-entropy both CPU backends (cpu_backend.cc, cpu_cnn.cc)
// end with. Internal: included only by them, which build with the same
// Eigen settings.
#ifndef PACER_WORKER_BUILTIN_CPU_LOSS_H_
#define PACER_WORKER_BUILTIN_CPU_LOSS_H_

#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace pacer::worker::cpu {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Turns each of `rows` logit rows (row-major, `classes` wide) into
// dLoss/dLogits = (softmax - onehot) * scale, in place; returns the summed
// cross-entropy of the rows.
inline double SoftmaxXentBackward(float* data, Eigen::Index rows, Eigen::Index classes,
                                  const uint8_t* y, float scale) {
  Eigen::Map<RowMat> logits(data, rows, classes);
  double loss = 0;
  for (Eigen::Index r = 0; r < rows; ++r) {
    auto row = logits.row(r);
    const float m = row.maxCoeff();
    const float shifted_target = row(y[r]) - m;
    row.array() = (row.array() - m).exp();
    const float sum = row.sum();
    loss += std::log(static_cast<double>(sum)) - shifted_target;
    row *= scale / sum;
    row(y[r]) -= scale;
  }
  return loss;
}

// Adds the rows' cross-entropy to *loss and the rows whose argmax is the
// label to *correct.
inline void ScoreLogits(const float* data, Eigen::Index rows, Eigen::Index classes,
                        const uint8_t* y, double* loss, size_t* correct) {
  Eigen::Map<const RowMat> logits(data, rows, classes);
  for (Eigen::Index r = 0; r < rows; ++r) {
    Eigen::Index argmax = 0;
    const float m = logits.row(r).maxCoeff(&argmax);
    const uint8_t label = y[r];
    const double sum = (logits.row(r).array() - m).exp().sum();
    *loss += std::log(sum) - (logits(r, label) - m);
    *correct += argmax == label ? 1 : 0;
  }
}

}  // namespace pacer::worker::cpu

#endif  // PACER_WORKER_BUILTIN_CPU_LOSS_H_
