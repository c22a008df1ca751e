// Parity with PyTorch: the torch.optim golden runs (tests/optimizer/golden,
// written by make_golden.py with torch 1.13) replayed through the shard's
// parameter table, every recorded parameter matched to 1e-5 relative (or
// 1e-7 absolute). Also what the table promises around a step: records
// replay bit for bit, snapshots and moves keep the optimizer state, and
// each key block keeps its own step count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ps/optimizer.h"
#include "ps/table.h"
#include "tests/optimizer_golden.h"

namespace pacer {
namespace {

// One table key per tensor of the run, in its group.
std::vector<TableKey> Keys(const GoldenRun& run) {
  std::vector<TableKey> keys;
  for (size_t i = 0; i < run.tensors.size(); ++i) {
    keys.push_back({i, run.tensors[i].size, run.tensors[i].group, 0});
  }
  return keys;
}

std::vector<wire::KeyLen> KeyLens(const GoldenRun& run) {
  std::vector<wire::KeyLen> keys;
  for (size_t i = 0; i < run.tensors.size(); ++i) keys.emplace_back(i, run.tensors[i].size);
  return keys;
}

std::vector<float> Flat(const ParamTable& t) {
  const FloatBuffer& p = t.params();
  return {p->begin(), p->end()};
}

// Replays steps [from, to) of `run` on `table`; compares after each recorded
// step. Returns the number of mismatching values (each one reported).
int Replay(const GoldenRun& run, ParamTable& table, size_t from, size_t to) {
  const std::vector<wire::KeyLen> keys = KeyLens(run);
  int bad = 0;
  for (size_t t = from; t < to; ++t) {
    const GoldenRun::Step& step = run.steps[t];
    StepRecord record;
    record.grad = {keys, step.grad};
    record.lr = step.lr;
    table.Step(record);
    auto want = run.params.find(static_cast<int>(t + 1));
    if (want == run.params.end()) continue;
    const std::vector<float> got = Flat(table);
    for (size_t i = 0; i < got.size(); ++i) {
      if (!GoldenClose(got[i], want->second[i]) && ++bad <= 5) {
        ADD_FAILURE() << run.name << " step " << t + 1 << " value " << i << ": pacer " << got[i]
                      << ", torch " << want->second[i];
      }
    }
  }
  return bad;
}

std::unique_ptr<ParamTable> Fresh(const GoldenRun& run) {
  const TableConfig config = run.Config();
  EXPECT_TRUE(ParamTable::ValidateConfig(config).ok());
  auto table = std::make_unique<ParamTable>(config);
  const std::vector<TableKey> keys = Keys(run);
  EXPECT_TRUE(table->Declare(keys).ok());
  const std::vector<wire::KeyLen> lens = KeyLens(run);
  table->Write({lens, run.init});
  return table;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTorchEveryTenStepsForTwoHundredSteps) {
  auto run = ReadGolden(GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->steps.size(), 200u);
  auto table = Fresh(*run);
  EXPECT_EQ(Replay(*run, *table, 0, run->steps.size()), 0);
}

TEST_P(GoldenTest, ASnapshotRestoredMidRunGoesOnExactly) {
  auto run = ReadGolden(GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  auto table = Fresh(*run);
  ASSERT_EQ(Replay(*run, *table, 0, 100), 0);
  const TableSnapshot snap = table->Snapshot();
  // The original goes on; the snapshot's buffers must not change under it.
  const std::vector<float> at_snapshot(snap.params->begin(), snap.params->end());
  ASSERT_EQ(Replay(*run, *table, 100, 200), 0);
  EXPECT_EQ(std::vector<float>(snap.params->begin(), snap.params->end()), at_snapshot);
  ParamTable restored(run->Config());
  ASSERT_TRUE(restored.Restore(snap).ok());
  EXPECT_EQ(Replay(*run, restored, 100, 200), 0);
  EXPECT_EQ(Flat(restored), Flat(*table)) << "bit for bit";
}

TEST_P(GoldenTest, KeysMovedToAnotherTableMidRunKeepTheirStateAndSteps) {
  auto run = ReadGolden(GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  auto table = Fresh(*run);
  ASSERT_EQ(Replay(*run, *table, 0, 100), 0);
  // Every key moves (as add-shard and drain-shard move them), then back.
  ParamTable other(run->Config());
  ASSERT_TRUE(other.Insert(table->Extract(0, UINT64_MAX)).ok());
  EXPECT_EQ(table->Drop(0, UINT64_MAX), run->tensors.size());
  EXPECT_EQ(other.Find(0)->steps, 100u);
  EXPECT_EQ(Replay(*run, other, 100, 150), 0);
  ASSERT_TRUE(table->Insert(other.Extract(0, UINT64_MAX)).ok());
  EXPECT_EQ(Replay(*run, *table, 150, 200), 0);
}

INSTANTIATE_TEST_SUITE_P(Torch, GoldenTest, ::testing::ValuesIn(GoldenCases()),
                         [](const auto& info) { return info.param; });

TEST(GoldenFilesTest, EveryOptimizerAndTheSettingsTheIssueNamesAreCovered) {
  std::map<OptimizerKind, int> kinds;
  bool nesterov = false, amsgrad = false, decay = false, two_groups = false, lr_change = false;
  for (const std::string& name : GoldenCases()) {
    auto run = ReadGolden(name);
    ASSERT_TRUE(run.ok()) << run.status();
    ++kinds[run->kind];
    for (const GroupSettings& g : run->groups) {
      nesterov |= g.nesterov.value_or(false);
      amsgrad |= g.amsgrad.value_or(false);
      decay |= g.weight_decay.value_or(0) > 0;
    }
    two_groups |= run->groups.size() > 1;
    for (size_t t = 1; t < run->steps.size(); ++t)
      lr_change |= run->steps[t].lr != run->steps[0].lr;
  }
  EXPECT_EQ(kinds.size(), 4u) << "sgd, adam, adamw and adagrad";
  EXPECT_TRUE(nesterov && amsgrad && decay && two_groups && lr_change);
}

TEST(TableTest, TheSameRecordsGiveTheSameStateBitForBit) {
  auto run = ReadGolden("adam_amsgrad_weight_decay");
  ASSERT_TRUE(run.ok()) << run.status();
  auto a = Fresh(*run), b = Fresh(*run);
  Replay(*run, *a, 0, 50);
  Replay(*run, *b, 0, 50);
  const TableSnapshot sa = a->Snapshot(), sb = b->Snapshot();
  EXPECT_TRUE(sa == sb);
  ASSERT_EQ(sa.state.size(), 3u) << "m, v and max v";
}

TEST(TableTest, AKeyThatJoinsLateCountsItsOwnSteps) {
  // Adam's first step moves every value by about lr (bias correction makes
  // m / sqrt(v) = sign(g)); a key that joins after 100 steps of the others
  // must take that first step too, not the 101st.
  TableConfig config{OptimizerKind::kAdam, DefaultSettings(OptimizerKind::kAdam), {}};
  ParamTable table(config);
  const TableKey first{0, 4, kDefaultGroup, 0};
  ASSERT_TRUE(table.Declare({&first, 1}).ok());
  const std::vector<float> g(4, 0.5f);
  const std::vector<wire::KeyLen> key0 = {{0, 4}};
  for (int i = 0; i < 100; ++i) table.Step({{key0, g}, 1.0f, {1e-3f}});
  TableSlice late;
  late.keys = {{1, 4, kDefaultGroup, 0}};
  late.values.assign(4 * 3, 0.0f);  // w = 0, m = 0, v = 0
  ASSERT_TRUE(table.Insert(late).ok());
  const std::vector<wire::KeyLen> key1 = {{1, 4}};
  table.Step({{key1, g}, 1.0f, {1e-3f}});
  EXPECT_EQ(table.Find(0)->steps, 100u);
  EXPECT_EQ(table.Find(1)->steps, 1u);
  for (float w : table.Param(1)) EXPECT_NEAR(w, -1e-3f, 1e-8f);
}

TEST(TableTest, AStepOfSomeKeysCopiesWhatAReplyHoldsFirst) {
  TableConfig config{OptimizerKind::kSgd, DefaultSettings(OptimizerKind::kSgd), {}};
  ParamTable table(config);
  const std::vector<TableKey> keys = {{0, 2, kDefaultGroup, 0}, {1, 2, kDefaultGroup, 0}};
  ASSERT_TRUE(table.Declare(keys).ok());
  const FloatBuffer held = table.params();  // a pull reply in flight
  const std::vector<float> before = *held;
  const std::vector<wire::KeyLen> key1 = {{1, 2}};
  const std::vector<float> g = {1.0f, 1.0f};
  table.Step({{key1, g}, 1.0f, {0.1f}});
  EXPECT_EQ(*held, before) << "the reply still sees the old values";
  EXPECT_NE(table.params().get(), held.get());
  EXPECT_EQ(table.Param(0)[0], 0.0f);
  EXPECT_FLOAT_EQ(table.Param(1)[0], -0.1f);
}

// What a replica takes from a state record: Read's values set by Assign
// give the reader's parameters, state and step counts, bit for bit, for
// every key or some; a reply or snapshot holding the old buffers keeps
// seeing the old values.
TEST(TableTest, AssignOfReadStateGivesTheSameTableAndSparesHeldBuffers) {
  auto run = ReadGolden("adam_amsgrad_weight_decay");
  ASSERT_TRUE(run.ok()) << run.status();
  auto a = Fresh(*run), b = Fresh(*run);
  Replay(*run, *a, 0, 20);
  Replay(*run, *b, 0, 10);
  const TableSnapshot held = b->Snapshot();
  std::vector<float> values;
  std::vector<uint64_t> steps;
  a->Read({}, &values, &steps);
  ASSERT_EQ(values.size(), a->values() * (1 + a->state_slots()));
  ASSERT_EQ(steps.size(), a->key_count());
  b->Assign({}, values, steps);
  EXPECT_TRUE(b->Snapshot() == a->Snapshot());
  for (const auto& [key, slot] : a->slots()) EXPECT_EQ(b->Find(key)->steps, slot.steps);
  auto c = Fresh(*run);
  Replay(*run, *c, 0, 10);
  EXPECT_TRUE(held == c->Snapshot()) << "the snapshot still holds the old values";
  // Some keys: the last one only.
  ASSERT_GE(a->key_count(), 2u);
  Replay(*run, *a, 20, 30);
  const auto& [last_key, last] = *a->slots().rbegin();
  const std::vector<wire::KeyLen> one = {{last_key, last.length}};
  values.clear();
  steps.clear();
  a->Read(one, &values, &steps);
  ASSERT_EQ(values.size(), last.length * (1 + a->state_slots()));
  b->Assign(one, values, steps);
  for (size_t i = 0; i <= a->state_slots(); ++i) {
    const auto want = i == 0 ? a->Param(last_key) : a->State(i - 1, last_key);
    const auto got = i == 0 ? b->Param(last_key) : b->State(i - 1, last_key);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end())) << "slot " << i;
  }
  EXPECT_EQ(b->Find(last_key)->steps, last.steps);
  for (const auto& [key, slot] : b->slots()) {
    if (key == last_key) continue;
    EXPECT_EQ(slot.steps, 20u) << "key " << key << " stays";
  }
}

// A key of a million floats is stepped in pieces on the shared pool's
// threads (ps/table.cc); the result is the one-call step's, bit for bit,
// for every optimizer, over several steps (so the state slots carry over).
TEST(TableTest, ABigKeySteppedInPiecesEqualsOneSerialStep) {
  const size_t n = (size_t{1} << 20) + 13;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW,
                             OptimizerKind::kAdagrad}) {
    OptimizerSettings settings = DefaultSettings(kind);
    settings.momentum = 0.9f;
    settings.weight_decay = 1e-4f;
    ParamTable table({kind, settings, {}});
    const TableKey key{5, n, kDefaultGroup, 0};
    ASSERT_TRUE(table.Declare({&key, 1}).ok());
    std::vector<float> w(n);
    for (size_t i = 0; i < n; ++i) w[i] = std::sin(static_cast<float>(i)) * 0.1f;
    const std::vector<wire::KeyLen> lens = {{5, n}};
    table.Write({lens, w});

    // The same steps, each one call of the kernel over the whole key.
    auto optimizer = MakeOptimizer(kind, /*amsgrad_slot=*/false);
    std::vector<std::vector<float>> state(optimizer->state_slots(),
                                          std::vector<float>(n, 0.0f));
    for (size_t s = 0; s < state.size(); ++s) {
      std::fill(state[s].begin(), state[s].end(), optimizer->InitialState(s, settings));
    }
    std::vector<float> g(n);
    for (uint64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < n; ++i) g[i] = std::cos(static_cast<float>(i * step)) * 0.01f;
      table.Step({{lens, g}, 1.0f, {settings.lr}});
      BlockStep b;
      b.n = n;
      b.w_in = w.data();
      b.w_out = w.data();
      for (size_t s = 0; s < state.size(); ++s) b.state_in[s] = b.state_out[s] = state[s].data();
      b.grad = g.data();
      b.lr = settings.lr;
      b.step = step;
      optimizer->Step(b, settings);
    }
    const std::span<const float> got = table.Param(5);
    ASSERT_EQ(got.size(), n);
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += std::memcmp(&got[i], &w[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << OptimizerName(kind);
  }
}

TEST(TableTest, BadSettingsAreRefusedWithTheirName) {
  TableConfig config{OptimizerKind::kAdam, DefaultSettings(OptimizerKind::kAdam), {}};
  GroupSettings g;
  g.name = "embedding";
  g.beta1 = 1.0f;
  config.groups = {g};
  absl::Status st = ParamTable::ValidateConfig(config);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("embedding"), std::string::npos) << st;
  EXPECT_NE(std::string(st.message()).find("beta"), std::string::npos) << st;
  config.groups[0].beta1 = 0.9f;
  config.groups[0].lr = -1.0f;
  EXPECT_FALSE(ParamTable::ValidateConfig(config).ok());
  config.groups[0].lr = 0.1f;
  config.groups.push_back(config.groups[0]);
  EXPECT_FALSE(ParamTable::ValidateConfig(config).ok()) << "a name twice";
  GroupSettings nesterov;
  nesterov.name = "n";
  nesterov.nesterov = true;
  nesterov.momentum = 0.0f;
  EXPECT_FALSE(ParamTable::ValidateConfig(
                   {OptimizerKind::kSgd, DefaultSettings(OptimizerKind::kSgd), {nesterov}})
                   .ok());
}

TEST(TableTest, AChangeOfOptimizerIsRefusedOnRestore) {
  TableConfig adam{OptimizerKind::kAdam, DefaultSettings(OptimizerKind::kAdam), {}};
  ParamTable table(adam);
  const TableKey k{0, 2, kDefaultGroup, 0};
  ASSERT_TRUE(table.Declare({&k, 1}).ok());
  ParamTable sgd({OptimizerKind::kSgd, DefaultSettings(OptimizerKind::kSgd), {}});
  absl::Status st = sgd.Restore(table.Snapshot());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("adam"), std::string::npos) << st;
}

}  // namespace
}  // namespace pacer
