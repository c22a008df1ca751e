// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/*)
// from valid inputs: messages of each kind a shard handles, a real
// checkpoint, and the settings files the repository ships. Run once by
// hand (tests/fuzz/run.sh --seeds); the corpus is kept in the repository.
//   make_seeds REPO_ROOT
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ps/checkpoint.h"
#include "ps/base/messages.h"
#include "ps/base/security.h"
#include "ps/base/wire.h"
#include "rocksdb/db.h"

namespace fs = std::filesystem;

namespace {

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// frame_fuzz's input format: each frame but the last as a 2-byte length
// and its bytes, the last one as is.
std::string Framed(const pacer::Frames& frames) {
  std::string out;
  for (size_t i = 0; i < frames.size(); ++i) {
    const std::string bytes(reinterpret_cast<const char*>(frames[i].data()), frames[i].size());
    if (i + 1 < frames.size()) {
      out.push_back(static_cast<char>(bytes.size() & 0xff));
      out.push_back(static_cast<char>(bytes.size() >> 8));
    }
    out += bytes;
  }
  return out;
}

std::string Len4(const std::string& s) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((s.size() >> (8 * i)) & 0xff);
  return out + s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds REPO_ROOT\n");
    return 2;
  }
  const fs::path root = argv[1];
  const fs::path corpus = root / "tests/fuzz/corpus";
  const std::vector<pacer::wire::KeyLen> keys = {{1, 2}, {2, 1}};
  const float values[3] = {0.5f, -1.0f, 2.0f};
  pacer::Envelope env;
  env.job_id = 7;
  env.sender = 11;
  int n = 0;
  auto frame = [&](auto build) {
    flatbuffers::FlatBufferBuilder fbb;
    env.request_id = static_cast<uint64_t>(++n);
    Write(corpus / "frame_fuzz" / ("seed-" + std::to_string(n)), Framed(build(fbb)));
  };
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    return pacer::EncodeBody(env, fbb, pacer::wire::CreatePushDirect(fbb, 0, 4, &keys),
                             pacer::Frame::Copy(values, sizeof values));
  });
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    auto kv = fbb.CreateVectorOfStructs(keys);
    pacer::wire::PushBuilder pb(fbb);
    pb.add_clock(3);
    pb.add_batch(8);
    pb.add_keys(kv);
    pb.add_seq(5);
    pb.add_part(1);
    pb.add_parts(2);
    return pacer::EncodeBody(env, fbb, pb.Finish(), pacer::Frame::Copy(values, sizeof values));
  });
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    return pacer::EncodeBody(env, fbb, pacer::wire::CreatePullDirect(fbb, 0, &keys, true));
  });
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    return pacer::EncodeBody(env, fbb, pacer::wire::CreateInitDirect(fbb, &keys),
                             pacer::Frame::Copy(values, sizeof values));
  });
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    env.sender = 0;
    std::vector<flatbuffers::Offset<pacer::wire::WorkerInfo>> w = {
        pacer::wire::CreateWorkerInfo(fbb, 11, 0, 1)};
    return pacer::EncodeBody(env, fbb, pacer::wire::CreateMembershipDirect(fbb, 2, &w));
  });
  frame([&](flatbuffers::FlatBufferBuilder& fbb) {
    return pacer::EncodeBody(env, fbb, pacer::wire::CreateMoveOut(fbb, 1, 2, false));
  });
  // Replication (frame_fuzz's shard backs up shard 5's range at epoch 1):
  // a seed, then a record of one step, from shard 5; and a backup's reply.
  frame([&](flatbuffers::FlatBufferBuilder&) {
    env.sender = 5;
    pacer::msg::Replicate seed;
    seed.range = 5;
    seed.epoch = 1;
    pacer::msg::MoveData m;
    m.keys = keys;
    m.applied_clock = 2;
    m.steps = 3;
    m.state_slots = 1;
    m.groups = {0, 0};
    m.key_steps = {3, 3};
    seed.seed = m;
    seed.marks = {{11, 4}};
    seed.ledger = {{11, 1, 4}};
    seed.applied_clock = 2;
    seed.step_count = 3;
    const float state[6] = {0.5f, -1.0f, 2.0f, 0.0f, 0.1f, 0.0f};
    return pacer::EncodeMessage(env, seed, pacer::Frame::Copy(state, sizeof state));
  });
  frame([&](flatbuffers::FlatBufferBuilder&) {
    env.sender = 5;
    pacer::msg::Replicate rec;
    rec.range = 5;
    rec.epoch = 1;
    rec.record = 1;
    pacer::msg::ReplicaStep step;
    step.keys = keys;
    step.lr = {0.1f};
    step.values = 3;
    rec.steps = {step};
    rec.marks = {{11, 5}};
    rec.applied = {{11, 5}};
    rec.applied_clock = 3;
    rec.step_count = 4;
    rec.check_begin = 1;
    rec.check_end = 3;
    return pacer::EncodeMessage(env, rec, pacer::Frame::Copy(values, sizeof values));
  });
  frame([&](flatbuffers::FlatBufferBuilder&) {
    // A record of the state an asp batch left (every key), not gradients.
    env.sender = 5;
    pacer::msg::Replicate rec;
    rec.range = 5;
    rec.epoch = 1;
    rec.record = 2;
    pacer::msg::ReplicaStep step;
    step.assign = true;
    step.values = 6;  // the parameters, then the momentum
    step.key_steps = {5, 5};
    rec.steps = {step};
    rec.marks = {{11, 9}};
    rec.applied = {{11, 6}, {11, 7}, {11, 8}, {11, 9}};
    rec.step_count = 9;
    const float state[6] = {0.4f, -0.9f, 1.9f, 0.1f, 0.1f, -0.1f};
    return pacer::EncodeMessage(env, rec, pacer::Frame::Copy(state, sizeof state));
  });
  frame([&](flatbuffers::FlatBufferBuilder&) {
    env.sender = 4;
    return pacer::EncodeMessage(env, pacer::msg::ReplicateReply{3, 1, false});
  });

  // A checkpoint, as its store holds it: the header, then each chunk.
  const fs::path tmp = fs::temp_directory_path() / "pacer-fuzz-seeds";
  fs::remove_all(tmp);
  {
    auto store = pacer::CheckpointStore::Open(tmp.string());
    if (!store.ok()) return 1;
    pacer::ShardSnapshot s;
    s.job_id = 7;
    s.shard_id = 3;
    s.applied_clock = 4;
    // Adam with a second parameter group: the optimizer's header fields
    // and two state slots.
    s.table.config.kind = pacer::OptimizerKind::kAdam;
    s.table.config.defaults = pacer::DefaultSettings(pacer::OptimizerKind::kAdam);
    pacer::GroupSettings no_decay;
    no_decay.name = "no_decay";
    no_decay.weight_decay = 0.0f;
    s.table.config.groups = {no_decay};
    s.table.keys = {{1, 2, 0, 4}, {2, 1, 1, 3}};
    s.table.params = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3});
    s.table.state = {std::make_shared<std::vector<float>>(std::vector<float>{0, 0, 1}),
                     std::make_shared<std::vector<float>>(std::vector<float>{1, 1, 2})};
    s.workers[11] = {4, 9};
    if (!(*store)->Save(s).ok()) return 1;
  }
  {
    rocksdb::DB* raw = nullptr;
    if (!rocksdb::DB::OpenForReadOnly(rocksdb::Options(), tmp.string(), &raw).ok()) return 1;
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string meta, p, v, w;
    db->Get(rocksdb::ReadOptions(), "meta", &meta);
    db->Get(rocksdb::ReadOptions(), "p/00000000", &p);
    db->Get(rocksdb::ReadOptions(), "v/00000000", &v);
    db->Get(rocksdb::ReadOptions(), "w/00000000", &w);
    // seed-1 (format 2, SGD with momentum, as an older build wrote it) stays
    // in the corpus for the migration path.
    Write(corpus / "checkpoint_fuzz/seed-2", Len4(meta) + Len4(p) + Len4(v) + Len4(w));
  }
  fs::remove_all(tmp);

  // Scenarios and settings the repository ships.
  for (const auto& e : fs::directory_iterator(root / "deploy/chaos")) {
    if (e.path().extension() == ".yaml") {
      Write(corpus / "scenario_fuzz" / e.path().filename(), Slurp(e.path()));
    }
  }
  for (const char* role : {"monitor", "server", "worker"}) {
    Write(corpus / "config_fuzz" / (std::string("toml-") + role),
          std::string(1, '\0') + Slurp(root / "deploy/config" / (std::string(role) + ".toml")));
  }
  Write(corpus / "config_fuzz/faults", std::string(1, '\1') +
                                           "drop:p=0.1;delay:ms=200,jitter=50;partition:peers=3,for=10");
  auto keypair = pacer::GenerateKeyPair();
  if (!keypair.ok()) return 1;
  Write(corpus / "config_fuzz/keyfile", std::string(1, '\2') + "public-key = \"" +
                                            keypair->public_key + "\"\nsecret-key = \"" +
                                            keypair->secret_key + "\"\n");
  Write(corpus / "config_fuzz/allowed", std::string(1, '\3') + "# the cluster\nmonitor " +
                                            keypair->public_key + "\n" + keypair->public_key + "\n");
  std::printf("seeds written under %s\n", corpus.c_str());
  return 0;
}
