#include "worker/builtin/mnist.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pacer::worker {
namespace {

// Whether the status message mentions `needle` (e.g. the offending file).
::testing::AssertionResult Mentions(const absl::Status& status,
                                    const std::string& needle) {
  if (status.message().find(needle) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << status.ToString() << "\" does not mention \"" << needle
         << "\"";
}

std::vector<uint8_t> IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  auto put32 = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(uint8_t(v >> shift));
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

class IdxFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "pacer_mnist_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `bytes` gzip-compressed and returns the path.
  std::string WriteGz(const std::string& name,
                      const std::vector<uint8_t>& bytes) {
    const std::string path = Path(name);
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f == nullptr) return path;
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
                static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }

  std::string WriteRaw(const std::string& name,
                       const std::vector<uint8_t>& bytes) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  static std::vector<uint8_t> ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in),
            std::istreambuf_iterator<char>()};
  }

  // A valid pair: 3 images of 2 rows x 4 cols (rows != cols catches a
  // transposed read) with every byte value pattern including 0 and 255.
  std::vector<uint8_t> TinyPixels() const {
    std::vector<uint8_t> pixels(3 * 2 * 4);
    std::mt19937 rng(7);
    for (auto& p : pixels) p = static_cast<uint8_t>(rng());
    pixels[0] = 0;
    pixels[1] = 255;
    return pixels;
  }
  const std::vector<uint8_t> tiny_labels_ = {7, 0, 9};

  std::string dir_;
};

TEST(FashionMnistTest, LoadsRealTestSet) {
  absl::StatusOr<Dataset> ds = LoadFashionMnist(kDefaultFashionMnistDir, false);
  ASSERT_TRUE(ds.ok()) << ds.status()
                       << " (is Debian's fashion-mnist package installed?)";
  EXPECT_EQ(ds->size(), 10000u);
  EXPECT_EQ(ds->rows, 28);
  EXPECT_EQ(ds->cols, 28);
  EXPECT_EQ(ds->features(), 784u);
  ASSERT_EQ(ds->images.size(), 10000u * 784u);
  std::array<int, 10> per_class{};
  for (uint8_t label : ds->labels) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  // The Fashion-MNIST test set is balanced.
  for (int count : per_class) EXPECT_EQ(count, 1000);
  const auto [lo, hi] =
      std::minmax_element(ds->images.begin(), ds->images.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
}

TEST_F(IdxFileTest, TinyGzPairRoundTripsExactly) {
  const std::vector<uint8_t> pixels = TinyPixels();
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {3, 2, 4}, pixels));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->rows, 2);
  EXPECT_EQ(ds->cols, 4);
  EXPECT_EQ(ds->size(), 3u);
  EXPECT_EQ(ds->labels, tiny_labels_);
  ASSERT_EQ(ds->images.size(), pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    EXPECT_EQ(ds->images[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  }
}

TEST_F(IdxFileTest, UncompressedFilesAlsoLoad) {
  const std::vector<uint8_t> pixels = TinyPixels();
  absl::StatusOr<Dataset> ds =
      LoadIdxPair(WriteRaw("img", IdxBytes(2051, {3, 2, 4}, pixels)),
                  WriteRaw("lbl", IdxBytes(2049, {3}, tiny_labels_)));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->labels, tiny_labels_);
  EXPECT_EQ(ds->images.back(), static_cast<float>(pixels.back()) / 255.0f);
}

TEST_F(IdxFileTest, TruncatedPayloadIsDataLoss) {
  std::vector<uint8_t> pixels = TinyPixels();
  pixels.resize(pixels.size() - 3);  // Header still promises 3 full images.
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {3, 2, 4}, pixels));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));
  EXPECT_TRUE(Mentions(ds.status(), "truncated"));
}

TEST_F(IdxFileTest, TruncatedHeaderIsDataLoss) {
  const std::string images = WriteGz("img.gz", {0, 0, 8, 3, 0, 0});
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));
}

TEST_F(IdxFileTest, TruncatedGzipStreamIsDataLoss) {
  const std::string full =
      WriteGz("full.gz", IdxBytes(2051, {3, 2, 4}, TinyPixels()));
  std::vector<uint8_t> gz = ReadRaw(full);
  ASSERT_GT(gz.size(), 40u);
  gz.resize(gz.size() - 12);  // Cuts into the deflate data and the trailer.
  const std::string images = WriteRaw("cut.gz", gz);
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));
}

TEST_F(IdxFileTest, TrailingBytesAreDataLoss) {
  std::vector<uint8_t> extra = tiny_labels_;
  extra.push_back(1);
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {3, 2, 4}, TinyPixels()));
  const std::string labels = WriteGz("lbl.gz", IdxBytes(2049, {3}, extra));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), labels));
}

TEST_F(IdxFileTest, WrongImageMagicIsInvalidArgument) {
  const std::string images =
      WriteGz("img.gz", IdxBytes(2052, {3, 2, 4}, TinyPixels()));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));
  EXPECT_TRUE(Mentions(ds.status(), "magic"));
}

TEST_F(IdxFileTest, SwappedFilesAreInvalidArgument) {
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {3, 2, 4}, TinyPixels()));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(labels, images);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), labels));
  EXPECT_TRUE(Mentions(ds.status(), "magic"));
}

TEST_F(IdxFileTest, CountMismatchIsInvalidArgument) {
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {3, 2, 4}, TinyPixels()));
  const std::string labels = WriteGz("lbl.gz", IdxBytes(2049, {2}, {1, 2}));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));
  EXPECT_TRUE(Mentions(ds.status(), labels));
}

TEST_F(IdxFileTest, ZeroSizedImageIsInvalidArgument) {
  const std::string images = WriteGz("img.gz", IdxBytes(2051, {3, 0, 4}, {}));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument)
      << ds.status();
}

TEST_F(IdxFileTest, HugeClaimedCountFailsWithoutHugeAllocation) {
  // 2^31 - 1 images of 28x28 would be 1.7 TB; the files hold a few bytes.
  const std::string images =
      WriteGz("img.gz", IdxBytes(2051, {0x7fffffff, 28, 28}, TinyPixels()));
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {0x7fffffff}, tiny_labels_));
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
}

TEST_F(IdxFileTest, MissingFileIsNotFound) {
  const std::string labels =
      WriteGz("lbl.gz", IdxBytes(2049, {3}, tiny_labels_));
  const std::string images = Path("no-such-file.gz");
  absl::StatusOr<Dataset> ds = LoadIdxPair(images, labels);
  ASSERT_EQ(ds.status().code(), absl::StatusCode::kNotFound) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), images));

  absl::StatusOr<Dataset> dir = LoadFashionMnist(Path("nowhere"), true);
  ASSERT_EQ(dir.status().code(), absl::StatusCode::kNotFound) << dir.status();
  EXPECT_TRUE(Mentions(dir.status(), "train-images-idx3-ubyte.gz"));
}

}  // namespace
}  // namespace pacer::worker
