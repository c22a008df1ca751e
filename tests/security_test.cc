// Transport security (ps/base/security.h, CURVE in ps/base/zmq_transport.cc): key and
// allowed-keys files, and the ZAP handler's decisions on a real ZeroMQ
// transport over 127.0.0.1.
#include "ps/base/security.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ps/base/clock.h"
#include "ps/base/sender_guard.h"
#include "ps/base/transport.h"
#include "tests/process_util.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;
using test::TempDir;

void WriteFile(const std::string& path, const std::string& text, mode_t mode = 0600) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
}

// The refusal log's throttle keeps the injected clock's time: one line per
// reason every 10 s, the next saying how many were left out.
TEST(LogThrottleTest, OneLinePerReasonPerPeriodOnTheInjectedClock) {
  FakeClock clock;  // starts at time 0, which is a time like any other
  LogThrottle log(&clock, std::chrono::seconds(10));
  uint64_t left_out = 99;
  EXPECT_TRUE(log.Allow("a", &left_out));
  EXPECT_EQ(left_out, 0u);
  EXPECT_FALSE(log.Allow("a", &left_out));
  EXPECT_TRUE(log.Allow("b", &left_out)) << "each reason has its own period";
  clock.Advance(std::chrono::milliseconds(9999));
  EXPECT_FALSE(log.Allow("a", &left_out));
  clock.Advance(std::chrono::milliseconds(1));
  EXPECT_TRUE(log.Allow("a", &left_out));
  EXPECT_EQ(left_out, 2u);
}

TEST(KeyFilesTest, KeygenWritesAKeyOnlyItsOwnerReadsAndAPublicLine) {
  ASSERT_TRUE(CurveAvailable()) << "Debian's libzmq5 has CURVE (libsodium)";
  TempDir dir;
  auto keys = GenerateKeyPair();
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(IsZ85Key(keys->public_key));
  EXPECT_TRUE(IsZ85Key(keys->secret_key));
  EXPECT_NE(keys->public_key, keys->secret_key);
  const std::string prefix = dir.path() + "/shard0";
  ASSERT_TRUE(WriteKeyFiles(*keys, prefix, "shard-0").ok());
  struct stat st {};
  ASSERT_EQ(::stat((prefix + ".key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = ReadKeyFile(prefix + ".key");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->public_key, keys->public_key);
  EXPECT_EQ(back->secret_key, keys->secret_key);
  auto allowed = ReadAllowedKeys(prefix + ".pub");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_EQ(allowed->size(), 1u);
  EXPECT_EQ((*allowed)[0].name, "shard-0");
  EXPECT_EQ(FindKey(*allowed, "shard-0"), keys->public_key);
  // Never overwrites a key.
  EXPECT_FALSE(WriteKeyFiles(*keys, prefix, "").ok());
}

TEST(KeyFilesTest, BadFilesAreClearErrors) {
  TempDir dir;
  auto keys = GenerateKeyPair();
  ASSERT_TRUE(keys.ok());
  const std::string good = "public-key = \"" + keys->public_key + "\"\nsecret-key = \"" +
                           keys->secret_key + "\"\n";
  WriteFile(dir.path() + "/open.key", good, 0644);
  auto open = ReadKeyFile(dir.path() + "/open.key");
  EXPECT_EQ(open.status().code(), absl::StatusCode::kPermissionDenied) << open.status();
  WriteFile(dir.path() + "/group.key", good, 0440);  // a Kubernetes Secret for fsGroup
  EXPECT_TRUE(ReadKeyFile(dir.path() + "/group.key").ok());
  WriteFile(dir.path() + "/short.key", "public-key = \"abc\"\n");
  auto bad = ReadKeyFile(dir.path() + "/short.key");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("short.key:1"), std::string::npos) << bad.status();
  WriteFile(dir.path() + "/half.key", "public-key = \"" + keys->public_key + "\"\n");
  EXPECT_FALSE(ReadKeyFile(dir.path() + "/half.key").ok());
  EXPECT_EQ(ReadKeyFile(dir.path() + "/none.key").status().code(), absl::StatusCode::kNotFound);
  // A public key from another keypair: peers would allow it, then every
  // handshake would fail.
  auto other = GenerateKeyPair();
  ASSERT_TRUE(other.ok());
  WriteFile(dir.path() + "/mixed.key", "public-key = \"" + other->public_key +
                                           "\"\nsecret-key = \"" + keys->secret_key + "\"\n");
  auto mixed = ReadKeyFile(dir.path() + "/mixed.key");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("not the secret key's"), std::string::npos)
      << mixed.status();

  // Allowed keys: comments, names, a key that starts with '#'.
  const std::string hash_key = std::string("#").append(keys->public_key, 1);
  WriteFile(dir.path() + "/allowed", "# the cluster\n\nmonitor " + keys->public_key + "\n" +
                                          hash_key + "\n");
  auto allowed = ReadAllowedKeys(dir.path() + "/allowed");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_EQ(allowed->size(), 2u);
  EXPECT_EQ(FindKey(*allowed, "monitor"), keys->public_key);
  EXPECT_EQ((*allowed)[1].public_key, hash_key);
  WriteFile(dir.path() + "/twice", "a " + keys->public_key + "\na " + keys->secret_key + "\n");
  auto twice = ReadAllowedKeys(dir.path() + "/twice");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice:2"), std::string::npos) << twice.status();
  WriteFile(dir.path() + "/junk", "monitor not-a-key\n");
  EXPECT_FALSE(ReadAllowedKeys(dir.path() + "/junk").ok());
}

// A CURVE server transport with one bound socket, recording refusals.
struct Server {
  explicit Server(const CurveKeyPair& keys, std::vector<std::string> allowed) {
    TransportOptions o;
    o.curve.keys = keys;
    o.curve.allowed = std::move(allowed);
    o.curve.on_refused = [this](const std::string& key, const std::string&, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu);
      refused.push_back({key, why});
    };
    transport = MakeZmqTransport(o);
    auto s = transport->Bind("tcp://127.0.0.1:0");
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) socket = std::move(*s);
  }
  // The next message within `wait`, or empty frames.
  Frames Receive(milliseconds wait) {
    Frames f;
    auto got = transport->Recv(socket.get(), &f, transport->clock()->Now() + wait);
    if (!got.ok() || !*got) f.clear();
    return f;
  }
  size_t Refusals(milliseconds wait) {
    const auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!refused.empty() || std::chrono::steady_clock::now() > until) return refused.size();
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  // Declared first, so destroyed last: the transport's ZAP thread reports
  // into them until the transport is gone (a race ThreadSanitizer found).
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> refused;  // key, why
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Socket> socket;
};

std::unique_ptr<Socket> Client(Transport& t, const std::string& address) {
  auto s = t.Connect(address);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// ZeroMQ's I/O threads of this process (threads named ZMQbg/IO/N).
int ZmqIoThreads() {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    n += comm.rfind("ZMQbg/IO/", 0) == 0;
  }
  return n;
}

// The I/O threads a transport made with `options` runs once it has a socket
// (ZeroMQ starts them with the first one), beyond those of this process
// before. A new thread takes its name a moment after it starts, so this
// waits up to 2 s for the count to reach `want`, and returns what it saw.
int IoThreadsOf(const TransportOptions& options, int want) {
  const int before = ZmqIoThreads();
  auto transport = MakeZmqTransport(options);
  auto socket = transport->Bind("tcp://127.0.0.1:0");
  EXPECT_TRUE(socket.ok()) << socket.status();
  int seen = ZmqIoThreads() - before;
  for (int i = 0; i < 400 && seen != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    seen = ZmqIoThreads() - before;
  }
  return seen;
}

// A transport runs the I/O threads it is asked for (ZMQ_IO_THREADS), and by
// default one per two cores, at most 4, so that connections to several
// shards are served in parallel.
TEST(ZmqTransportTest, RunsTheIoThreadsItIsAskedFor) {
  TransportOptions options;
  options.io_threads = 3;
  EXPECT_EQ(IoThreads(options), 3);
  EXPECT_EQ(IoThreadsOf(options, 3), 3);
  TransportOptions automatic;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(IoThreads(automatic), std::clamp(cores / 2, 1, 4));
  EXPECT_EQ(IoThreadsOf(automatic, std::clamp(cores / 2, 1, 4)), std::clamp(cores / 2, 1, 4));
}

TEST(CurveTransportTest, AnAllowedKeyIsHeardAndNamedAndOthersAreRefused) {
  auto server_keys = GenerateKeyPair(), allowed = GenerateKeyPair(), other = GenerateKeyPair();
  ASSERT_TRUE(server_keys.ok() && allowed.ok() && other.ok());
  Server server(*server_keys, {allowed->public_key});
  const std::string address = server.socket->address();

  // Allowed: the message arrives, with the sender's key on its first frame,
  // and the reply goes back.
  TransportOptions co;
  co.curve.keys = *allowed;
  auto ct = MakeZmqTransport(co);
  EXPECT_FALSE(ct->Connect(address).ok()) << "CURVE without the server's key must not connect";
  ct->SetServerKey(address, server_keys->public_key);
  auto client = Client(*ct, address);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Send({Frame::Copy("hello")}).ok());
  Frames got = server.Receive(milliseconds(5000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].peer_key(), allowed->public_key);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got[1].data()), got[1].size()), "hello");
  ASSERT_TRUE(server.socket->Send({got[0], Frame::Copy("back")}).ok());
  Frames reply;
  auto r = ct->Recv(client.get(), &reply, ct->clock()->Now() + milliseconds(5000));
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(server.Refusals(milliseconds(0)), 0u);

  // A key not on the list: refused by ZAP, nothing delivered.
  TransportOptions xo;
  xo.curve.keys = *other;
  auto xt = MakeZmqTransport(xo);
  xt->SetServerKey(address, server_keys->public_key);
  auto intruder = Client(*xt, address);
  ASSERT_NE(intruder, nullptr);
  (void)intruder->Send({Frame::Copy("overwrite the model")});
  ASSERT_EQ(server.Refusals(milliseconds(5000)), 1u);
  {
    std::lock_guard<std::mutex> lock(server.mu);
    EXPECT_EQ(server.refused[0].first, other->public_key);
  }
  EXPECT_TRUE(server.Receive(milliseconds(300)).empty());

  // Plain ZeroMQ: the handshake fails, reported without a key.
  auto pt = MakeZmqTransport({});
  auto plain = Client(*pt, address);
  ASSERT_NE(plain, nullptr);
  (void)plain->Send({Frame::Copy("plain")});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.Refusals(milliseconds(0)) < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GE(server.Refusals(milliseconds(0)), 2u);
  {
    std::lock_guard<std::mutex> lock(server.mu);
    EXPECT_EQ(server.refused[1].first, "");
  }
  EXPECT_TRUE(server.Receive(milliseconds(300)).empty());
}

// A plain peer that connects the moment the socket is bound is reported too
// (the handshake events are watched from the bind on), naming the endpoint.
TEST(CurveTransportTest, AHandshakeFailureRightAfterTheBindIsReported) {
  auto server_keys = GenerateKeyPair();
  ASSERT_TRUE(server_keys.ok());
  Server server(*server_keys, {});
  auto pt = MakeZmqTransport({});
  auto plain = Client(*pt, server.socket->address());
  ASSERT_NE(plain, nullptr);
  (void)plain->Send({Frame::Copy("plain")});
  ASSERT_GE(server.Refusals(milliseconds(5000)), 1u);
  std::lock_guard<std::mutex> lock(server.mu);
  EXPECT_EQ(server.refused[0].first, "");
  EXPECT_NE(server.refused[0].second.find("handshake failed"), std::string::npos);
  EXPECT_NE(server.refused[0].second.find(server.socket->address()), std::string::npos)
      << server.refused[0].second;
}

}  // namespace
}  // namespace pacer
