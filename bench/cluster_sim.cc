#include "bench/cluster_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <random>
#include <optional>
#include <set>

#include "monitor/data_stream.h"
#include "ps/base/clock.h"
#include "ps/staleness.h"
#include "worker/chunk_reader.h"

namespace pacer::sim {

absl::StatusOr<Scenario> ParseScenario(const std::string& name) {
  if (name == "none") return Scenario::kNone;
  if (name == "static") return Scenario::kStatic;
  if (name == "hetero") return Scenario::kHetero;
  if (name == "bursts") return Scenario::kBursts;
  if (name == "moving") return Scenario::kMoving;
  return absl::InvalidArgumentError("unknown scenario '" + name +
                                    "' (none, static, hetero, bursts, moving)");
}

namespace {

// Slowdown factor of each worker over time.
class SpeedTrace {
 public:
  explicit SpeedTrace(const SimOptions& o) : o_(o), bursts_(static_cast<size_t>(o.workers)) {
    if (o.scenario != Scenario::kBursts) return;
    std::mt19937_64 rng(o.seed);
    std::exponential_distribution<double> gap(std::max(1e-9, o.burst_rate));
    for (auto& b : bursts_) {
      for (double t = gap(rng); t < o.seconds; t += o.burst_seconds + gap(rng)) {
        b.emplace_back(t, t + o.burst_seconds);
      }
    }
  }

  double Factor(int worker, double t) const {
    const int n = o_.workers;
    switch (o_.scenario) {
      case Scenario::kNone: return 1;
      case Scenario::kStatic: return worker == n - 1 ? o_.slow_factor : 1;
      case Scenario::kHetero:
        return n == 1 ? 1 : 1 + (o_.slow_factor - 1) * worker / static_cast<double>(n - 1);
      case Scenario::kMoving: {
        const auto slot = static_cast<int64_t>(std::floor(t / std::max(1e-9, o_.move_every)));
        return worker == static_cast<int>((n - 1 + slot) % n) ? o_.slow_factor : 1;
      }
      case Scenario::kBursts: {
        const auto& b = bursts_[static_cast<size_t>(worker)];
        auto it = std::upper_bound(b.begin(), b.end(), std::make_pair(t, 1e300));
        if (it == b.begin()) return 1;
        --it;
        return t < it->second ? o_.slow_factor : 1;
      }
    }
    return 1;
  }

 private:
  const SimOptions& o_;
  std::vector<std::vector<std::pair<double, double>>> bursts_;
};

// The noise of a shared node (SimOptions::noise, colocated_*), per worker.
// Multiplier(i, t) must be asked at non-decreasing t for each worker.
class NoiseTrace {
 public:
  explicit NoiseTrace(const SimOptions& o)
      : o_(o), rng_(o.seed * 0x9E3779B97F4A7C15ull + 17), state_(static_cast<size_t>(o.workers)),
        jobs_(static_cast<size_t>(o.workers)) {
    if (o.noise > 0) {
      std::normal_distribution<double> start(0, o.noise / 2);
      for (auto& st : state_) st.x = start(rng_);
    }
    if (o.colocated_rate > 0) {
      std::exponential_distribution<double> gap(o.colocated_rate);
      std::exponential_distribution<double> length(1 / std::max(1e-9, o.colocated_seconds));
      for (auto& j : jobs_) {
        for (double t = gap(rng_); t < o.seconds; t += gap(rng_)) j.emplace_back(t, t + length(rng_));
      }
    }
  }

  double Multiplier(int worker, double t) {
    double m = 1;
    if (o_.noise > 0) {
      State& st = state_[static_cast<size_t>(worker)];
      const double dt = std::max(0.0, t - st.t);
      const double keep = std::exp(-dt / std::max(1e-9, o_.noise_seconds));
      st.x = st.x * keep + (o_.noise / 2) * std::sqrt(std::max(0.0, 1 - keep * keep)) * normal_(rng_);
      st.t = t;
      m *= 1 + std::clamp(st.x, -o_.noise, o_.noise);
    }
    for (const auto& [from, to] : jobs_[static_cast<size_t>(worker)]) {
      if (from <= t && t < to) m *= 1 + o_.colocated_load;
    }
    return m;
  }

 private:
  struct State {
    double t = 0, x = 0;
  };
  const SimOptions& o_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
  std::vector<State> state_;
  std::vector<std::vector<std::pair<double, double>>> jobs_;
};

struct SimWorker {
  uint64_t clock = 0;  // the clock it reads next
  uint32_t batch = 0;  // of the iteration in flight
  uint32_t assigned = 0;  // batch from the last heartbeat reply
  policy::TimingReport unreported;  // since the last heartbeat
  bool blocked = false;
  double blocked_since = 0;
  int64_t pushed = -1;
  std::deque<double> push_times;
  double compute = 0, wait = 0;  // of the iteration in flight
  double started = 0;            // when the iteration in flight started
  double wait_total = 0;
  // Straggler grading (SimResult::slow_*): -1 until first within 25% of
  // its fair share; then iterations counted from there.
  double reached = -1;
  uint64_t graded = 0, in_band = 0;
  // The data stream (SimOptions::data_samples): its chunks, the samples of
  // the iteration in flight, and those trained since its last heartbeat.
  std::optional<worker::ChunkReader> reader;
  uint32_t take = 0;
  double window_samples = 0;
};

enum class EventKind { kRead, kPush, kHeartbeat };

struct Event {
  double time;
  uint64_t seq;
  int worker;
  EventKind kind;
  bool operator>(const Event& e) const { return time != e.time ? time > e.time : seq > e.seq; }
};

TimePoint At(double seconds) { return TimePoint{} + FromSeconds(seconds); }

}  // namespace

std::vector<double> FairShares(const std::vector<double>& factor, double global_batch,
                               double seconds_per_sample, double overhead) {
  // Equal compute X = (overhead + b_i c) f_i for the unclamped workers:
  //   b_i = (X / f_i - overhead) / c,  sum b_i = B_free
  //   => X = (B_free c + n_free overhead) / sum 1 / f_i;
  // a worker whose b_i would be below 1 is fixed at 1 and X recomputed.
  const size_t n = factor.size();
  std::vector<double> b(n, 0);
  std::vector<bool> fixed(n, false);
  for (;;) {
    double inv = 0, free_batch = global_batch, free_n = 0;
    for (size_t i = 0; i < n; ++i) {
      if (fixed[i]) {
        free_batch -= 1;
      } else {
        inv += 1 / factor[i];
        free_n += 1;
      }
    }
    if (free_n == 0) break;
    const double x = (free_batch * seconds_per_sample + free_n * overhead) / inv;
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (fixed[i]) continue;
      b[i] = (x / factor[i] - overhead) / seconds_per_sample;
      if (b[i] < 1) b[i] = 1, fixed[i] = true, changed = true;
    }
    if (!changed) break;
  }
  for (size_t i = 0; i < n; ++i) {
    if (fixed[i]) b[i] = 1;
  }
  return b;
}

absl::StatusOr<SimResult> Simulate(const SimOptions& o) {
  if (o.workers < 1) return absl::InvalidArgumentError("at least one worker");
  if (o.batch < 1 || o.seconds <= 0 || o.seconds_per_sample <= 0 || o.communication < 0) {
    return absl::InvalidArgumentError("batch, seconds and seconds per sample must be positive");
  }
  if (o.staleness + o.staleness_range > kMaxStalenessBound) {
    return absl::InvalidArgumentError("staleness bound above " + std::to_string(kMaxStalenessBound));
  }
  if (o.data_samples > 0 && (o.epochs == 0 || o.report_interval <= 0)) {
    return absl::InvalidArgumentError("a data stream needs epochs and a report interval");
  }
  const int n = o.workers;
  const SpeedTrace trace(o);
  NoiseTrace noise(o);
  policy::PolicyOptions popts;
  popts.fit_seconds = o.fit_seconds;
  popts.damping = o.damping;
  popts.probe = o.probe;
  popts.shift_seconds = o.shift_seconds;
  popts.kind = o.policy;
  popts.mode = o.mode;
  popts.batch.global_batch = o.batch * static_cast<uint32_t>(n);
  popts.batch.deadband = o.deadband;
  popts.level_shift = o.level_shift;
  popts.level_shift_faster = o.level_shift_faster;
  popts.catch_up_iterations = o.catch_up;
  popts.staleness = o.staleness;
  popts.staleness_range = o.staleness_range;
  popts.interval = FromSeconds(o.policy_interval);
  policy::StragglerPolicy policy(popts);
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  policy.SetWorkers(ids);

  std::vector<SimWorker> w(static_cast<size_t>(n));
  std::optional<DataStream> stream;
  if (o.data_samples > 0) {
    DataStreamOptions so;
    so.samples = o.data_samples;
    so.epochs = o.epochs;
    so.chunk_samples = o.chunk_samples;
    stream.emplace(so);
  }
  std::set<std::pair<int64_t, int>> by_pushed;  // (pushed, worker): begin() is the slowest
  for (int i = 0; i < n; ++i) by_pushed.insert({-1, i});
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t seq = 0;
  int64_t applied = -1;
  struct Open {
    int count = 0;
    double samples = 0;
    uint32_t min_batch = UINT32_MAX, max_batch = 0;
  };
  std::map<uint64_t, Open> open;
  std::vector<int> blocked;
  SimResult r;
  double decision_total = 0;
  const double even = static_cast<double>(o.batch);  // B / n
  double stable_samples = 0;
  double min_ratio = 1e300, max_ratio = 0;
  auto stable = [&](uint32_t lo, uint32_t hi) { return lo >= 0.5 * even && hi <= 1.5 * even; };
  auto note_batch = [&](uint32_t b) {
    min_ratio = std::min(min_ratio, b / even);
    max_ratio = std::max(max_ratio, b / even);
  };
  // Straggler grading needs speeds that do not move (none, static, hetero).
  const bool grade = o.scenario == Scenario::kNone || o.scenario == Scenario::kStatic ||
                     o.scenario == Scenario::kHetero;
  std::vector<double> factor(static_cast<size_t>(n)), fair;
  for (int i = 0; i < n; ++i) factor[static_cast<size_t>(i)] = trace.Factor(i, 0);
  if (grade) fair = FairShares(factor, even * n, o.seconds_per_sample, o.iteration_overhead);
  auto grade_push = [&](int i) {
    if (!grade || factor[static_cast<size_t>(i)] <= 1) return;
    SimWorker& me = w[static_cast<size_t>(i)];
    const double f = fair[static_cast<size_t>(i)];
    const bool ok = std::abs(me.batch - f) <= 0.25 * f;
    if (me.reached < 0 && ok) me.reached = me.started;
    if (me.reached >= 0) {
      ++me.graded;
      if (ok) ++me.in_band;
    }
  };
  const double half_comm = o.communication / 2;
  const size_t needed =
      o.mode == wire::Mode::Backup && o.backup_workers < static_cast<uint32_t>(n)
          ? static_cast<size_t>(n) - o.backup_workers
          : static_cast<size_t>(n);

  auto allowed = [&](int i, uint64_t c) {
    const auto& me = w[static_cast<size_t>(i)];
    const policy::Assignment a = policy.assignment(static_cast<uint32_t>(i));
    switch (o.mode) {
      case wire::Mode::Asp: return true;
      case wire::Mode::Ssp: return SspReadAllowed(c, applied, a.staleness);
      case wire::Mode::Dssp: {
        if (SspReadAllowed(c, applied, a.staleness)) return true;
        const auto& slow = w[static_cast<size_t>(by_pushed.begin()->second)];
        std::vector<double> mine(me.push_times.begin(), me.push_times.end());
        std::vector<double> theirs(slow.push_times.begin(), slow.push_times.end());
        const uint32_t extra = DsspExtraIterations(mine, theirs, a.staleness_range);
        return SspReadAllowed(c, applied, a.staleness + extra);
      }
      default: return SspReadAllowed(c, applied, 0);  // bsp, backup
    }
  };
  // Starts worker i's iteration at time t (its read is allowed).
  auto start = [&](int i, double t) {
    SimWorker& me = w[static_cast<size_t>(i)];
    if (me.blocked) {
      me.wait = t - me.blocked_since;
      me.wait_total += me.wait;
      me.blocked = false;
    } else {
      me.wait = 0;
    }
    me.batch = std::max<uint32_t>(
        1, o.report_interval > 0 ? me.assigned : policy.assignment(static_cast<uint32_t>(i)).batch);
    me.take = me.batch;
    if (stream) {
      const auto span = me.reader->PlanPositions(me.batch);
      me.take = span ? static_cast<uint32_t>(span->count) : 0;
    }
    me.compute = me.take == 0 ? 0
                              : (me.take * o.seconds_per_sample + o.iteration_overhead) *
                                    trace.Factor(i, t) * noise.Multiplier(i, t);
    me.started = t;
    events.push({t + half_comm + me.compute + half_comm, seq++, i, EventKind::kPush});
  };
  auto try_read = [&](int i, double t) {
    SimWorker& me = w[static_cast<size_t>(i)];
    if (allowed(i, me.clock)) return start(i, t);
    if (!me.blocked) {
      me.blocked = true;
      me.blocked_since = t;
      blocked.push_back(i);
    }
  };
  auto recheck_blocked = [&](double t) {
    std::vector<int> still;
    for (int i : blocked) {
      if (allowed(i, w[static_cast<size_t>(i)].clock)) {
        start(i, t);
      } else {
        still.push_back(i);
      }
    }
    blocked.swap(still);
  };

  auto count_round = [&] {
    if (policy.rounds() > r.rounds) {
      r.rounds = policy.rounds();
      decision_total += policy.last_decision_seconds();
      r.decision_max_seconds = std::max(r.decision_max_seconds, policy.last_decision_seconds());
    }
  };
  // The monitor's side of the stream, timed (SimResult::stream_*).
  double stream_total_us = 0;
  auto timed = [&](auto&& call) {
    const auto start = std::chrono::steady_clock::now();
    auto out = call();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    ++r.stream_calls;
    stream_total_us += us;
    r.stream_max_us = std::max(r.stream_max_us, us);
    return out;
  };
  // The data stream: every worker known to it before the first hand-out.
  auto exchange = [&](int i, double t) {
    SimWorker& me = w[static_cast<size_t>(i)];
    const std::vector<wire::DataChunk> report = me.reader->Report();
    me.reader->Sync(timed([&] {
      stream->Report(static_cast<uint32_t>(i), report, At(t));
      return stream->Assign(static_cast<uint32_t>(i), At(t));
    }));
    if (stream->finished() && r.epochs_seconds < 0) r.epochs_seconds = t;
  };
  if (stream) {
    for (int i = 0; i < n; ++i) {
      stream->SetPace(static_cast<uint32_t>(i), 0, policy.assignment(static_cast<uint32_t>(i)).batch);
      w[static_cast<size_t>(i)].reader.emplace(o.seed, o.data_samples);
    }
    for (int i = 0; i < n; ++i) exchange(i, 0);
  }
  for (int i = 0; i < n; ++i) {
    w[static_cast<size_t>(i)].assigned = policy.assignment(static_cast<uint32_t>(i)).batch;
    events.push({0, seq++, i, EventKind::kRead});
    if (o.report_interval > 0) {
      events.push({o.report_interval * (i + 0.5) / n, seq++, i, EventKind::kHeartbeat});
    }
  }
  while (!events.empty() && events.top().time <= o.seconds && r.epochs_seconds < 0) {
    const Event e = events.top();
    events.pop();
    if (e.kind == EventKind::kRead) {
      try_read(e.worker, e.time);
      continue;
    }
    SimWorker& me = w[static_cast<size_t>(e.worker)];
    if (e.kind == EventKind::kHeartbeat) {
      // The monitor takes the report, runs a round if one is due (or
      // urgent), and replies with the worker's assignment.
      me.unreported.clock = me.clock;
      me.unreported.at = At(e.time);
      policy.Report(static_cast<uint32_t>(e.worker), me.unreported);
      me.unreported = policy::TimingReport{};
      policy.Round(At(e.time));
      count_round();
      me.assigned = policy.assignment(static_cast<uint32_t>(e.worker)).batch;
      if (stream) {
        // Its speed as the trainer reports it: samples over the window.
        stream->SetPace(static_cast<uint32_t>(e.worker), me.window_samples / o.report_interval,
                        me.assigned);
        me.window_samples = 0;
        exchange(e.worker, e.time);
      }
      events.push({e.time + o.report_interval, seq++, e.worker, EventKind::kHeartbeat});
      continue;
    }
    const uint64_t c = me.clock;
    policy::TimingReport rep;
    rep.iterations = 1;
    rep.samples = me.batch;
    rep.compute_seconds = me.compute;
    rep.min_compute = rep.max_compute = me.compute;
    rep.communication_seconds = o.communication;
    rep.wait_seconds = me.wait;
    // As the trainer: a short batch (a chunk's end) or an empty push is not
    // timed for the policy.
    if (me.take < me.batch) {
    } else if (o.report_interval > 0) {
      me.unreported += rep;
    } else {
      rep.clock = c + 1;
      rep.at = At(e.time);
      policy.Report(static_cast<uint32_t>(e.worker), rep);
    }
    if (stream) {
      // Acknowledged: the position moves, and the monitor hears at once.
      me.reader->Ack();
      me.window_samples += me.take;
      exchange(e.worker, e.time);
      me.batch = me.take;  // what the push carries (samples and stability)
    }
    auto record_push = [&] {
      by_pushed.erase({me.pushed, e.worker});
      me.pushed = std::max(me.pushed, static_cast<int64_t>(c));
      by_pushed.insert({me.pushed, e.worker});
      me.push_times.push_back(e.time);
      if (me.push_times.size() > 8) me.push_times.pop_front();
    };
    if (static_cast<int64_t>(c) > applied || o.mode == wire::Mode::Asp) {
      note_batch(me.batch);
      grade_push(e.worker);
    }
    if (o.mode == wire::Mode::Asp) {
      record_push();
      r.samples += me.batch;
      if (stable(me.batch, me.batch)) stable_samples += me.batch;
      applied = std::max(applied, static_cast<int64_t>(c));
      ++r.clocks;
      me.clock = c + 1;
      events.push({e.time, seq++, e.worker, EventKind::kRead});
    } else if (static_cast<int64_t>(c) <= applied) {
      // Backup: the clock closed without this push; it is dropped and the
      // worker reads the latest parameters, then goes on from there.
      ++r.dropped;
      me.clock = static_cast<uint64_t>(applied + 1);
      events.push({e.time + half_comm, seq++, e.worker, EventKind::kRead});
    } else {
      record_push();
      Open& oc = open[c];
      ++oc.count;
      oc.samples += me.batch;
      oc.min_batch = std::min(oc.min_batch, me.batch);
      oc.max_batch = std::max(oc.max_batch, me.batch);
      bool closed = false;
      for (auto it = open.begin();
           it != open.end() && static_cast<int64_t>(it->first) == applied + 1 &&
           static_cast<size_t>(it->second.count) >= needed;
           it = open.erase(it)) {
        applied = static_cast<int64_t>(it->first);
        r.samples += it->second.samples;
        if (stable(it->second.min_batch, it->second.max_batch)) stable_samples += it->second.samples;
        ++r.clocks;
        closed = true;
      }
      me.clock = c + 1;
      if (closed) recheck_blocked(e.time);
      try_read(e.worker, e.time);
    }
    // The monitor's own tick (new sizes take effect at each worker's next
    // iteration start, or next heartbeat reply).
    policy.Round(At(e.time));
    count_round();
  }

  // The ideal: the sum of the workers' speeds when the global batch B is
  // split in proportion to speed and nobody waits. Each iteration then takes
  // the same T*, with (b_i * spp + overhead) * f_i + comm = T* for every i
  // and sum b_i = B:
  //   T* = (B + sum (comm + overhead f_i) / (spp f_i)) / sum 1 / (spp f_i),
  // and the cluster does B samples per T*. Speeds change with the trace, so
  // T* is taken on a 10 ms grid.
  // A stream's run ends when its epochs are trained.
  const double duration = r.epochs_seconds > 0 ? r.epochs_seconds : o.seconds;
  double ideal_samples = 0;
  const double B = static_cast<double>(o.batch) * n;
  const double step = 0.01;
  for (double t = 0; t < duration; t += step) {
    double inv = 0, extra = 0;
    for (int i = 0; i < n; ++i) {
      const double f = trace.Factor(i, t);
      inv += 1 / (o.seconds_per_sample * f);
      extra += (o.communication + o.iteration_overhead * f) / (o.seconds_per_sample * f);
    }
    const double t_star = (B + extra) / inv;
    ideal_samples += B / t_star * std::min(step, duration - t);
  }
  double waited = 0;
  for (int i = 0; i < n; ++i) {
    const SimWorker& me = w[static_cast<size_t>(i)];
    waited += me.wait_total + (me.blocked ? duration - me.blocked_since : 0);
  }
  r.throughput = r.samples / duration;
  r.ideal_throughput = ideal_samples / duration;
  r.fraction = r.ideal_throughput > 0 ? r.throughput / r.ideal_throughput : 0;
  r.wait_fraction = waited / (duration * n);
  if (stream) {
    r.stream_mean_us = r.stream_calls ? stream_total_us / static_cast<double>(r.stream_calls) : 0;
    r.epochs_done = stream->epoch();
    r.epochs_floor_seconds =
        r.ideal_throughput > 0
            ? static_cast<double>(r.epochs_done) * static_cast<double>(o.data_samples) /
                  r.ideal_throughput
            : 0;
    for (uint32_t e = 0; e < r.epochs_done; ++e) {
      r.max_tail_seconds = std::max(r.max_tail_seconds, stream->tail_seconds(e).value_or(0));
    }
  }
  r.decision_mean_seconds = r.rounds ? decision_total / static_cast<double>(r.rounds) : 0;
  r.fixed_cost_samples = policy.fixed_cost_samples();
  r.level_shifts = policy.level_shifts();
  r.stable_fraction = r.samples > 0 ? stable_samples / r.samples : 0;
  r.min_batch_ratio = min_ratio > 1e299 ? 0 : min_ratio;
  r.max_batch_ratio = max_ratio;
  if (grade) {
    r.slow_reach_seconds = 0;
    for (int i = 0; i < n; ++i) {
      const SimWorker& me = w[static_cast<size_t>(i)];
      if (factor[static_cast<size_t>(i)] <= 1) continue;
      ++r.slow_workers;
      if (me.reached < 0 || r.slow_reach_seconds < 0) {
        r.slow_reach_seconds = -1;
      } else {
        r.slow_reach_seconds = std::max(r.slow_reach_seconds, me.reached);
      }
      r.slow_in_band_fraction =
          std::min(r.slow_in_band_fraction,
                   me.graded ? static_cast<double>(me.in_band) / static_cast<double>(me.graded) : 0);
    }
    if (r.slow_workers == 0) r.slow_reach_seconds = -1;
  }
  r.min_batch = UINT32_MAX;
  for (const auto& [id, a] : policy.assignments()) {
    r.min_batch = std::min(r.min_batch, a.batch);
    r.max_batch = std::max(r.max_batch, a.batch);
  }
  return r;
}

}  // namespace pacer::sim
