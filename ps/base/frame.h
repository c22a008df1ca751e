// Frames: the byte buffers the transport moves, with shared ownership so that
// a payload can travel zero-copy from a sender's buffer into ZeroMQ and from
// ZeroMQ's receive buffer into the code that reads it.
#ifndef PACER_PS_BASE_FRAME_H_
#define PACER_PS_BASE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pacer {

// An immutable view of bytes plus whatever keeps them alive. Cheap to copy.
class Frame {
 public:
  Frame() = default;
  // Shares `owner`, which must keep [data, data+size) alive and unchanged.
  Frame(std::shared_ptr<const void> owner, const void* data, size_t size)
      : owner_(std::move(owner)), data_(static_cast<const uint8_t*>(data)), size_(size) {}

  // Copies `size` bytes into a new frame.
  static Frame Copy(const void* data, size_t size) {
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(data),
                                                      static_cast<const uint8_t*>(data) + size);
    const uint8_t* p = buf->data();
    return Frame(std::move(buf), p, size);
  }
  static Frame Copy(std::string_view s) { return Copy(s.data(), s.size()); }
  // Takes ownership of `bytes`.
  static Frame FromVector(std::vector<uint8_t> bytes) {
    auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    const uint8_t* p = buf->data();
    size_t n = buf->size();
    return Frame(std::move(buf), p, n);
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

  // The CURVE public key (Z85) the sender authenticated with, on frame 0
  // (the peer's routing id) of a message a bound socket received under
  // CURVE; empty otherwise. Never sent.
  const std::string& peer_key() const {
    static const std::string kNone;
    return peer_key_ ? *peer_key_ : kNone;
  }
  void set_peer_key(std::string key) {
    peer_key_ = std::make_shared<const std::string>(std::move(key));
  }

 private:
  std::shared_ptr<const void> owner_;
  std::shared_ptr<const std::string> peer_key_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One multipart message, in order.
using Frames = std::vector<Frame>;

}  // namespace pacer

#endif  // PACER_PS_BASE_FRAME_H_
