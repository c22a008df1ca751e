#include "worker/builtin/mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pacer::worker {
namespace {

constexpr uint32_t kImageMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims.
constexpr uint32_t kLabelMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim.
// Generous bounds that still keep count * rows * cols far from overflow.
constexpr uint32_t kMaxCount = 0x7fffffff;
constexpr uint32_t kMaxSide = 1u << 15;
// Reserve at most this much up front; beyond it the buffer grows only as bytes
// actually arrive, so a lying header cannot trigger a huge allocation.
constexpr size_t kMaxUpfrontReserve = size_t{64} << 20;
constexpr unsigned kChunk = 1u << 20;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// zlib's description of the last error on `f`, or "" if none. zlib prefixes
// the path, which our messages already start with, so that is dropped.
std::string GzErrorText(gzFile f, const std::string& path) {
  int errnum = Z_OK;
  const char* text = gzerror(f, &errnum);
  if (errnum == Z_OK || text == nullptr || *text == '\0') return "";
  std::string_view message = text;
  if (message.starts_with(path + ": ")) message.remove_prefix(path.size() + 2);
  return " (zlib: " + std::string(message) + ")";
}

// An IDX file whose header has been read and checked; the payload follows.
struct IdxFile {
  std::string path;
  GzPtr gz;
  std::vector<uint32_t> dims;
  size_t payload_bytes = 1;
};

// Reads exactly n bytes, appending them to *out. A short read is DataLoss.
absl::Status ReadExact(IdxFile& f, size_t n, std::vector<uint8_t>* out,
                       const char* what) {
  const size_t start = out->size();
  out->reserve(start + std::min(n, kMaxUpfrontReserve));
  size_t done = 0;
  while (done < n) {
    const unsigned want =
        static_cast<unsigned>(std::min<size_t>(n - done, kChunk));
    out->resize(start + done + want);
    const int got = gzread(f.gz.get(), out->data() + start + done, want);
    if (got < 0) {
      out->resize(start + done);
      return absl::DataLossError(f.path + ": read error in " + what +
                                 GzErrorText(f.gz.get(), f.path));
    }
    done += static_cast<size_t>(got);
    if (static_cast<unsigned>(got) < want) {
      out->resize(start + done);
      return absl::DataLossError(f.path + ": truncated " + what + ": needed " +
                                 std::to_string(n) + " bytes, only " +
                                 std::to_string(done) + " present" +
                                 GzErrorText(f.gz.get(), f.path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<IdxFile> OpenIdx(const std::string& path, uint32_t magic,
                                size_t ndims, const char* kind) {
  IdxFile f;
  f.path = path;
  errno = 0;
  f.gz.reset(gzopen(path.c_str(), "rb"));
  if (f.gz == nullptr) {
    const int err = errno;
    if (err == 0) return absl::ResourceExhaustedError(path + ": gzopen failed");
    return absl::ErrnoToStatus(err, path + ": cannot open");
  }
  gzbuffer(f.gz.get(), 1u << 17);

  // Magic first, so a wrong kind of file is reported as such even when it is
  // too short for this kind's header.
  std::vector<uint8_t> header;
  auto be32 = [&header](size_t i) {
    return (uint32_t{header[4 * i]} << 24) |
           (uint32_t{header[4 * i + 1]} << 16) |
           (uint32_t{header[4 * i + 2]} << 8) | uint32_t{header[4 * i + 3]};
  };
  if (absl::Status s = ReadExact(f, 4, &header, "IDX header"); !s.ok()) {
    return s;
  }
  if (be32(0) != magic) {
    return absl::InvalidArgumentError(
        path + ": bad magic number " + std::to_string(be32(0)) + " (want " +
        std::to_string(magic) + " for an IDX " + kind + " file)");
  }
  if (absl::Status s = ReadExact(f, 4 * ndims, &header, "IDX header");
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < ndims; ++i) {
    const uint32_t d = be32(1 + i);
    const uint32_t limit = i == 0 ? kMaxCount : kMaxSide;
    if ((i > 0 && d == 0) || d > limit) {
      return absl::InvalidArgumentError(path + ": bad IDX dimension " +
                                        std::to_string(i) + " = " +
                                        std::to_string(d));
    }
    f.dims.push_back(d);
    f.payload_bytes *= d;
  }
  return f;
}

// Reads the payload and checks nothing follows it.
absl::Status ReadPayload(IdxFile& f, std::vector<uint8_t>* out) {
  if (absl::Status s = ReadExact(f, f.payload_bytes, out, "IDX payload");
      !s.ok()) {
    return s;
  }
  uint8_t extra;
  const int got = gzread(f.gz.get(), &extra, 1);
  if (got < 0) {
    return absl::DataLossError(f.path + ": read error after IDX payload" +
                               GzErrorText(f.gz.get(), f.path));
  }
  if (got > 0) {
    return absl::DataLossError(f.path +
                               ": unexpected bytes after the IDX payload of " +
                               std::to_string(f.payload_bytes) + " bytes");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_gz,
                                    const std::string& labels_gz) {
  absl::StatusOr<IdxFile> images = OpenIdx(images_gz, kImageMagic, 3, "image");
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxFile> labels = OpenIdx(labels_gz, kLabelMagic, 1, "label");
  if (!labels.ok()) return labels.status();
  // Check the headers agree before reading megabytes of payload.
  if (images->dims[0] != labels->dims[0]) {
    return absl::InvalidArgumentError(
        images_gz + " has " + std::to_string(images->dims[0]) + " images but " +
        labels_gz + " has " + std::to_string(labels->dims[0]) + " labels");
  }

  Dataset ds;
  ds.rows = static_cast<int>(images->dims[1]);
  ds.cols = static_cast<int>(images->dims[2]);
  if (absl::Status s = ReadPayload(*labels, &ds.labels); !s.ok()) return s;
  std::vector<uint8_t> pixels;
  if (absl::Status s = ReadPayload(*images, &pixels); !s.ok()) return s;
  ds.images.resize(pixels.size());
  std::transform(pixels.begin(), pixels.end(), ds.images.begin(),
                 [](uint8_t p) { return static_cast<float>(p) / 255.0f; });
  return ds;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  return LoadIdxPair(prefix + "-images-idx3-ubyte.gz",
                     prefix + "-labels-idx1-ubyte.gz");
}

}  // namespace pacer::worker
