// Transport security on a real cluster (issue 8): a monitor, a shard and two
// workers with their own CURVE keys train Fashion-MNIST; a process whose key
// is not allowed, or that speaks plain ZeroMQ, is refused by the monitor and
// by the shard, and each refusal is counted.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "ps/base/security.h"
#include "ps/base/transport.h"
#include "tests/cluster_harness.h"

namespace pacer::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Keys for each role, and the allowed list of the cluster (not the intruder).
struct Keys {
  Keys() {
    for (const char* role : {"monitor", "shard", "worker", "operator", "intruder"}) {
      auto k = GenerateKeyPair();
      EXPECT_TRUE(k.ok()) << k.status();
      EXPECT_TRUE(WriteKeyFiles(*k, Path(role), role).ok());
      pairs[role] = *k;
    }
    std::ofstream allowed(dir.path() + "/allowed");
    for (const char* role : {"monitor", "shard", "worker", "operator"}) {
      allowed << role << " " << pairs[role].public_key << "\n";
    }
  }
  std::string Path(const std::string& role) const { return dir.path() + "/" + role; }
  std::vector<std::string> Flags(const std::string& role) const {
    return {"--key", Path(role) + ".key", "--allowed-keys", dir.path() + "/allowed"};
  }
  TempDir dir;
  std::map<std::string, CurveKeyPair> pairs;
};

double Refused(const std::string& metrics_address, const std::string& reason) {
  return MetricValue(FetchMetrics(metrics_address), "pacer_security_refused_peers_total",
                     {"reason=\"" + reason + "\""})
      .value_or(-1);
}

TEST(SecurityClusterTest, AllowedKeysTrainAndEveryOtherPeerIsRefused) {
  ASSERT_TRUE(CurveAvailable());
  Keys keys;
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 2;
  spec.monitor_flags = keys.Flags("monitor");
  spec.monitor_flags.insert(spec.monitor_flags.end(),
                            {"--time-cap", "120", "--eval-interval", "1", "--global-batch", "128"});
  // Retries must pass the request-id check: the shard receives some
  // messages twice, and some of its replies never reach the workers, who
  // then send the same request again.
  spec.shard_flags = keys.Flags("shard");
  spec.shard_flags.insert(spec.shard_flags.end(), {"--faults", "duplicate:p=0.05"});
  spec.worker_flags = keys.Flags("worker");
  spec.worker_flags.insert(spec.worker_flags.end(), {"--train-limit", "12000", "--test-limit", "1000",
                                                     "--faults", "drop:p=0.02,type=PushReply"});
  Cluster cluster(spec);
  ASSERT_TRUE(cluster.Start());

  // The allowed members train: the monitor reports an accuracy well above
  // chance, from parameters the workers pushed to the shard.
  double accuracy = 0;
  const auto until = std::chrono::steady_clock::now() + seconds(90);
  while (accuracy < 0.7 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(300));
    accuracy = MetricValue(FetchMetrics(cluster.monitor_metrics),
                           "pacer_training_test_accuracy_ratio")
                   .value_or(0);
  }
  ASSERT_GE(accuracy, 0.7) << cluster.Logs();
  EXPECT_EQ(Refused(cluster.monitor_metrics, "key_not_allowed"), 0);
  EXPECT_EQ(Refused(cluster.shard_metrics[0], "key_not_allowed"), 0);
  const std::string shard_page = FetchMetrics(cluster.shard_metrics[0]);
  EXPECT_GT(MetricValue(shard_page, "pacer_faults_injected_total", {"kind=\"duplicate\""})
                .value_or(0),
            0)
      << "no message was duplicated: the retries below were not tried";
  EXPECT_EQ(MetricValue(shard_page, "pacer_security_refused_messages_total",
                        {"reason=\"request_id_reused\""})
                .value_or(-1),
            0)
      << "a retry was taken for a forged request";

  // A worker whose key is not allowed cannot register with the monitor.
  std::vector<std::string> intruder = {PACER_WORKER_BIN, "--monitor", cluster.monitor_address,
                                       "--start-timeout", "3", "--request-timeout", "3",
                                       "--train-limit", "100", "--test-limit", "100"};
  auto flags = keys.Flags("intruder");
  intruder.insert(intruder.end(), flags.begin(), flags.end());
  auto bad = Process::Start(intruder, cluster.dir.path(), "intruder");
  auto code = bad->Wait(milliseconds(30000));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0) << bad->Stderr();
  EXPECT_GE(Refused(cluster.monitor_metrics, "key_not_allowed"), 1);
  EXPECT_NE(cluster.monitor->Stderr().find(keys.pairs["intruder"].public_key), std::string::npos)
      << "the refusal is logged with the key";

  // Plain ZeroMQ: refused at the handshake, by the monitor...
  auto plain = Process::Start({PACER_WORKER_BIN, "--monitor", cluster.monitor_address,
                               "--start-timeout", "3", "--train-limit", "100", "--test-limit", "100"},
                              cluster.dir.path(), "plain");
  code = plain->Wait(milliseconds(30000));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_GE(Refused(cluster.monitor_metrics, "handshake_failed"), 1);

  // ... and by the shard, to a push sent straight at it, with a key not
  // allowed and without CURVE: nothing is answered, both are counted.
  for (bool curve : {true, false}) {
    TransportOptions o;
    if (curve) o.curve.keys = keys.pairs["intruder"];
    auto t = MakeZmqTransport(o);
    t->SetServerKey(cluster.shard_addresses[0], keys.pairs["shard"].public_key);
    auto s = t->Connect(cluster.shard_addresses[0]);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Send({Frame::Copy("a push")}).ok());
    Frames reply;
    auto got = t->Recv(s->get(), &reply, t->clock()->Now() + milliseconds(1500));
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(*got) << "the shard answered a peer it must refuse";
  }
  EXPECT_GE(Refused(cluster.shard_metrics[0], "key_not_allowed"), 1);
  EXPECT_GE(Refused(cluster.shard_metrics[0], "handshake_failed"), 1);

  // pacerctl with any allowed key reads the job's status; only an operator's
  // key changes the job.
  const auto pacerctl = [&](const std::string& role, std::vector<std::string> args) {
    std::vector<std::string> ctl = {PACERCTL_BIN, "--monitor", cluster.monitor_address};
    auto flags = keys.Flags(role);
    ctl.insert(ctl.end(), flags.begin(), flags.end());
    ctl.insert(ctl.end(), args.begin(), args.end());
    return Process::Start(ctl, cluster.dir.path(), "pacerctl-" + role);
  };
  auto status = pacerctl("worker", {"status"});
  code = status->Wait(milliseconds(20000));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << status->Stderr();
  EXPECT_NE(status->Stdout().find("shard"), std::string::npos) << status->Stdout();
  auto set = pacerctl("worker", {"fault", "set", "all", "drop:p=1"});
  code = set->Wait(milliseconds(20000));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0) << "a worker's key set faults";
  EXPECT_NE(set->Stderr().find("operator key"), std::string::npos) << set->Stderr();
  auto clear = pacerctl("operator", {"fault", "clear"});
  code = clear->Wait(milliseconds(20000));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << clear->Stderr();
}

}  // namespace
}  // namespace pacer::test
