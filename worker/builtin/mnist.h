// Loader for (Fashion-)MNIST data in the IDX format, gzip-compressed or not.
//
// The IDX format is big-endian: a 4-byte magic number (2051 for 3-d unsigned
// byte image files, 2049 for 1-d unsigned byte label files), one 4-byte size
// per dimension, then the raw bytes. Debian's fashion-mnist package ships the
// four standard files gzip-compressed under kDefaultFashionMnistDir.

#ifndef PACER_WORKER_BUILTIN_MNIST_H_
#define PACER_WORKER_BUILTIN_MNIST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer::worker {

// Where Debian's fashion-mnist package installs its files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

// An in-memory labelled image set. A plain value: copyable and movable, no
// internal synchronization (concurrent reads are fine).
struct Dataset {
  int rows = 0, cols = 0;  // 28, 28 for (Fashion-)MNIST.
  // size() * rows * cols floats; image i starts at images[i * features()] and
  // is stored row-major. Pixel values are byte / 255.0f, so in [0, 1].
  std::vector<float> images;
  std::vector<uint8_t> labels;  // One per image, 0..9 for (Fashion-)MNIST.

  size_t size() const { return labels.size(); }
  size_t features() const { return size_t(rows) * cols; }
};

// Loads one IDX image file and its IDX label file. Each file may be gzip
// compressed or plain (zlib reads plain files transparently). The whole file
// pair is read into memory; memory grows with the bytes actually present, so
// a header that lies about its size cannot force a huge allocation.
//
// Never throws. Thread-safe (no shared state). On failure the message names the
// offending file and the returned status is:
//   NotFound / PermissionDenied / ...  the file cannot be opened (from errno);
//   InvalidArgument  wrong magic number, a zero or oversized dimension, or the
//                    image and label counts disagree;
//   DataLoss         the file is truncated, has bytes past the declared
//                    payload, or the gzip stream is corrupt.
[[nodiscard]] absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_gz,
                                                  const std::string& labels_gz);

// Loads Fashion-MNIST from `dir` (e.g. kDefaultFashionMnistDir): with
// train = true the training set (train-images-idx3-ubyte.gz and
// train-labels-idx1-ubyte.gz, 60000 samples), otherwise the test set (t10k-*,
// 10000 samples). Same errors and thread-safety as LoadIdxPair.
[[nodiscard]] absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir,
                                                       bool train);

}  // namespace pacer::worker

#endif  // PACER_WORKER_BUILTIN_MNIST_H_
