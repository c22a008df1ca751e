// The invariants of a chaos run, checked against the runner's own record
// (the workers' --ack-log journals) once the run is over.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <set>

#include "spdlog/fmt/fmt.h"
#include "tests/chaos/runner.h"

namespace pacer::chaos {
namespace {

// The last `n` lines of the file at `path` that contain `needle`, each from
// `from` on (the whole line when it has no `from`), joined by " | " (empty
// when none).
std::string LastLinesWith(const std::string& path, const std::string& needle,
                          const std::string& from, size_t n) {
  std::ifstream in(path);
  std::deque<std::string> kept;
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) == std::string::npos) continue;
    const size_t at = line.find(from);
    kept.push_back(at == std::string::npos ? line : line.substr(at));
    if (kept.size() > n) kept.pop_front();
  }
  std::string joined;
  for (const std::string& l : kept) joined += (joined.empty() ? "" : " | ") + l;
  return joined;
}

// How many pushes the worker whose log is `path` sent again to range `id`
// at `address` (its new address after a failover, or its shard's
// restart): each kept push not yet durable (ps/client.cc: "sending N
// push(es) not yet durable (seq A..B) again to shard ID at ADDRESS, ...").
double PushesResentTo(const std::string& path, uint32_t id, const std::string& address) {
  if (address.empty()) return 0;
  std::ifstream in(path);
  const std::string to = " again to shard " + std::to_string(id) + " at " + address + ",";
  double n = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("sending ");
    if (at == std::string::npos || line.find(" not yet durable ") == std::string::npos ||
        line.find(to) == std::string::npos) {
      continue;
    }
    n += std::strtod(line.c_str() + at + 8, nullptr);
  }
  return n;
}

// Of the series `values` (key: metric + labels), the sum of those named
// `name` whose key contains every label.
double Sum(const std::map<std::string, double>& values, const std::string& name,
           const std::vector<std::string>& labels = {}) {
  double sum = 0;
  for (const auto& [key, v] : values) {
    if (key.rfind(name, 0) != 0) continue;
    const char next = key.size() > name.size() ? key[name.size()] : '\0';
    if (next != '{' && next != '\0') continue;
    bool all = true;
    for (const auto& l : labels) all &= key.find(l) != std::string::npos;
    if (all) sum += v;
  }
  return sum;
}

// Of `p`'s last scrapes, the sum of the series named `name` (as Sum does),
// and the earliest ask and latest answer among those scrapes; nullopt when
// no scrape had it.
struct LastSum {
  double value = 0, at = 0, done = 0;
};
// A shard's series of a range it serves since a promotion (range="...")
// are left out: the process is judged on its own range's counts, the
// promoted range by its ledgers.
std::optional<LastSum> Last(const std::map<std::string, Proc::Sample>& last,
                            const std::string& name) {
  std::optional<LastSum> r;
  for (const auto& [key, s] : last) {
    if (key.rfind(name, 0) != 0) continue;
    const char next = key.size() > name.size() ? key[name.size()] : '\0';
    if (next != '{' && next != '\0') continue;
    if (key.find("range=\"") != std::string::npos) continue;
    if (!r) r = LastSum{0, s.at, s.done};
    r->value += s.value;
    r->at = std::min(r->at, s.at);
    r->done = std::max(r->done, s.done);
  }
  return r;
}

// The largest value seen of `name` (summed as Sum does) in `p`; own_only:
// of the process's own range (not of one it serves since a promotion).
double Seen(const Proc* p, const std::string& name, const std::vector<std::string>& labels = {},
            bool own_only = false) {
  if (!own_only) return Sum(p->seen, name, labels);
  std::map<std::string, double> own;
  for (const auto& [key, v] : p->seen) {
    if (key.find("range=\"") == std::string::npos) own.emplace(key, v);
  }
  return Sum(own, name, labels);
}

}  // namespace

void Runner::CheckInvariants() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    const std::vector<Ack> acks = Acks(i);
    all_acks_.insert(all_acks_.end(), acks.begin(), acks.end());
  }
  ledgers_ = Ledgers();
  const bool replicated = std::any_of(ledgers_.begin(), ledgers_.end(),
                                      [](const LedgerBlock& b) { return b.epoch > 0; });
  const Invariants& inv = s_.invariants;
  if (inv.progress_within > 0) CheckProgress();
  if (inv.no_crash) CheckNoCrash();
  if (inv.no_hang) CheckNoHang();
  if (inv.lost_bound) CheckLostBound();
  if (inv.no_double_apply) CheckNoDoubleApply();
  if (inv.final_accuracy > 0) CheckFinalAccuracy();
  if (inv.faults_in_metrics) CheckFaultsInMetrics();
  if (replicated && inv.durable_kept) CheckDurableKept();
  if (replicated && inv.acked_kept) CheckAckedKept();
  if (replicated && inv.replicas_identical) CheckReplicasIdentical();
  if (replicated && inv.no_split_brain) CheckNoSplitBrain();
  if (inv.once_per_epoch) CheckOncePerEpoch();
}

void Runner::CheckOncePerEpoch() {
  Verdict v{"once_per_epoch", "each training sample once per epoch (--data-stream)", true, ""};
  // The training set's size and the epochs done, from every monitor's log.
  uint64_t samples = 0;
  int done = -1;  // the last epoch logged as done
  for (Proc* p : All()) {
    if (p->name().rfind("monitor", 0) != 0) continue;
    std::ifstream log(dir_ + "/" + p->name() + ".log");
    const std::regex over("data stream over ([0-9]+) samples"), ended("epoch ([0-9]+) done");
    std::smatch m;
    for (std::string line; std::getline(log, line);) {
      if (std::regex_search(line, m, over)) samples = std::stoull(m[1]);
      if (std::regex_search(line, m, ended)) done = std::max(done, std::stoi(m[1]));
    }
  }
  if (samples == 0) {
    v.applicable = false;
    v.detail = "the job does not read a data stream";
    verdicts_.push_back(v);
    return;
  }
  // (epoch, index) -> times trained; and what a killed worker may repeat:
  // its last batch.
  std::map<uint32_t, std::vector<uint8_t>> counts;
  std::set<std::pair<uint32_t, uint32_t>> may_repeat;
  size_t lines = 0;
  for (size_t w = 0; w < sample_logs_.size(); ++w) {
    std::ifstream log(sample_logs_[w]);
    // Its last batch; in mode local, its last round (the lines after the
    // last "round CLOCK").
    std::vector<std::pair<uint32_t, uint32_t>> last;
    bool rounds = false;
    for (std::string line; std::getline(log, line);) {
      if (line.rfind("round ", 0) == 0) {
        rounds = true;
        last.clear();
        continue;
      }
      std::istringstream in(line);
      uint64_t chunk = 0;
      uint32_t epoch = 0;
      if (!(in >> chunk >> epoch)) continue;
      ++lines;
      if (!rounds) last.clear();
      std::vector<uint8_t>& c = counts[epoch];
      c.resize(samples);
      for (uint32_t i; in >> i;) {
        if (i >= samples) {
          v.pass = false;
          v.detail += fmt::format("worker{} trained index {} of {}; ", w, i, samples);
          continue;
        }
        c[i] = static_cast<uint8_t>(std::min(255, c[i] + 1));
        last.emplace_back(epoch, i);
      }
    }
    // A worker killed, or frozen or cut off past its lease, is dead to the
    // job: its last batch (mode local: round) may be trained again
    // (monitor/README.md: "Elastic workers").
    if (w < workers_.size() &&
        (workers_[w]->killed_on_purpose || workers_[w]->lost_on_purpose)) {
      may_repeat.insert(last.begin(), last.end());
    }
  }
  size_t skipped = 0, twice = 0, repeats = 0;
  std::string first;
  for (const auto& [epoch, c] : counts) {
    for (uint32_t i = 0; i < c.size(); ++i) {
      const bool complete = static_cast<int>(epoch) <= done;
      if (complete && c[i] == 0) {
        if (++skipped <= 3) first += fmt::format("epoch {} index {} never trained; ", epoch, i);
      } else if (c[i] == 2 && may_repeat.count({epoch, i})) {
        ++repeats;
      } else if (c[i] >= 2) {
        if (++twice <= 3) first += fmt::format("epoch {} index {} trained {} times; ", epoch, i, c[i]);
      }
    }
  }
  if (done < 0 && lines > 0) first += "no epoch ended; ";
  if (skipped > 0 || twice > 0 || done < 0) {
    v.pass = false;
    v.detail += fmt::format("{} skipped, {} repeated outside a dead worker's last batch: {}",
                            skipped, twice, first);
  } else if (v.pass) {
    v.detail = fmt::format(
        "epochs 0..{} each trained every one of {} samples once ({} repeats, all in a dead "
        "(killed, or frozen or cut off past its lease) worker's last batch); none twice in the epoch under way",
        done, samples, repeats);
  }
  verdicts_.push_back(v);
}

namespace {
// Of the ledgers, each range's final primary: the one of the highest epoch
// (then record) among the shards that left by themselves.
std::map<uint32_t, const LedgerBlock*> FinalPrimaries(
    const std::vector<LedgerBlock>& blocks) {
  std::map<uint32_t, const LedgerBlock*> final;
  for (const auto& b : blocks) {
    final.emplace(b.range, nullptr);
    if (!b.primary) continue;  // a backup, or a deposed old primary
    const LedgerBlock*& f = final[b.range];
    if (f == nullptr || b.epoch > f->epoch || (b.epoch == f->epoch && b.record > f->record)) f = &b;
  }
  return final;
}
}  // namespace

void Runner::CheckDurableKept() {
  Verdict v{"durable_kept", "every durable push in its range's final primary", true, ""};
  const auto final = FinalPrimaries(ledgers_);
  for (const auto& [range, f] : final) {
    if (f == nullptr) {
      v.pass = false;
      v.detail += fmt::format("range of shard {}: no replica of it left at the end; ", range);
    }
  }
  uint64_t durable_total = 0, acked_total = 0;
  for (size_t i = 0; i < workers_.size() && i < worker_ids_.size(); ++i) {
    uint64_t through = 0;
    const std::vector<Ack> acks = Acks(i, &through);
    std::set<uint64_t> seqs;
    for (const Ack& a : acks) {
      if (a.seq <= through) seqs.insert(a.seq);
    }
    durable_total += seqs.size();
    acked_total += acks.size();
    for (const auto& [range, f] : final) {
      if (f == nullptr) continue;
      uint64_t missing = 0, first = 0;
      for (uint64_t seq : seqs) {
        if (!f->ledger.Contains(worker_ids_[i], seq)) {
          if (missing++ == 0) first = seq;
        }
      }
      if (missing > 0) {
        v.pass = false;
        v.detail += fmt::format(
            "worker {} (id {}): {} push(es) journalled durable missing from the range of shard {} "
            "(final primary on shard{}, epoch {}), the first seq {}; ",
            i, worker_ids_[i], missing, range, f->shard, f->epoch, first);
      }
    }
  }
  if (v.pass) {
    v.detail = fmt::format(
        "{} push(es) journalled durable (of {} acknowledged) are each in the ledger of all {} "
        "ranges' final primaries",
        durable_total, acked_total, final.size());
  }
  verdicts_.push_back(v);
}

void Runner::CheckAckedKept() {
  Verdict v{"acked_kept", "every acknowledged push of a live worker in its range's final primary",
            true, ""};
  // A worker that lived keeps each push until it is durable and sends it
  // again to a range's new owner: of its acknowledged pushes, every one up
  // to the last its range applied must be there. Those after it were in
  // clocks still open when the job stopped (acknowledged on receipt).
  const auto final = FinalPrimaries(ledgers_);
  uint64_t checked = 0, open_at_end = 0;
  for (size_t i = 0; i < workers_.size() && i < worker_ids_.size(); ++i) {
    if (workers_[i]->killed_on_purpose) continue;
    const uint32_t id = worker_ids_[i];
    std::set<uint64_t> seqs;
    for (const Ack& a : Acks(i)) seqs.insert(a.seq);
    for (const auto& [range, f] : final) {
      if (f == nullptr || seqs.empty()) continue;
      auto last = seqs.rbegin();
      while (last != seqs.rend() && !f->ledger.Contains(id, *last)) ++last;
      uint64_t missing = 0, first = 0;
      for (uint64_t seq : seqs) {
        if (last == seqs.rend() || seq > *last) {
          ++open_at_end;
          continue;
        }
        ++checked;
        if (!f->ledger.Contains(id, seq) && missing++ == 0) first = seq;
      }
      if (missing > 0) {
        v.pass = false;
        v.detail += fmt::format(
            "worker {} (id {}): {} acknowledged push(es) missing from the range of shard {} "
            "(final primary on shard{}, epoch {}), the first seq {}; ",
            i, id, missing, range, f->shard, f->epoch, first);
      }
    }
  }
  if (v.pass) {
    v.detail = fmt::format(
        "{} (worker, range) acknowledgements each in the range's final primary; {} after the "
        "last its range applied (clocks open when the job stopped)",
        checked, open_at_end);
  }
  verdicts_.push_back(v);
}

void Runner::CheckReplicasIdentical() {
  Verdict v{"replicas_identical", "backups identical to their primaries", true, ""};
  const auto final = FinalPrimaries(ledgers_);
  size_t compared = 0;
  for (const auto& [range, f] : final) {
    if (f == nullptr) continue;
    bool any = false;
    for (const LedgerBlock& b : ledgers_) {
      if (b.primary || b.deposed || b.range != range || b.epoch != f->epoch) continue;
      any = true;
      ++compared;
      if (b.record != f->record || b.crc != f->crc || b.ledger.Spans() != f->ledger.Spans()) {
        v.pass = false;
        v.detail += fmt::format(
            "range of shard {}: the backup on shard{} holds record {} (CRC-32 {}, {} pushes{}), "
            "the primary on shard{} record {} (CRC-32 {}, {} pushes); ",
            range, b.shard, b.record, b.crc, b.pushes, b.last ? "" : ", no last record", f->shard,
            f->record, f->crc, f->pushes);
      }
    }
    if (!any) v.detail += fmt::format("range of shard {}: no backup at the end; ", range);
  }
  if (compared == 0) {
    v.applicable = false;
    v.detail += "no range had a backup at the end: nothing to compare";
  } else if (v.pass) {
    v.detail += fmt::format(
        "{} backup(s) hold their primary's last record, CRC-32 of parameters and optimizer "
        "state, and ledger",
        compared);
  }
  verdicts_.push_back(v);
}

void Runner::CheckNoSplitBrain() {
  Verdict v{"no_split_brain", "no range acknowledged by two primaries at once", true, ""};
  // Per range and epoch: the first and the last acknowledgement journalled,
  // and how many.
  struct Span {
    double first = 0, last = 0;
    size_t acks = 0;
  };
  std::map<uint32_t, std::map<uint64_t, Span>> ranges;
  for (const Ack& a : all_acks_) {
    for (const auto& [range, epoch] : a.epochs) {
      Span& sp = ranges[range][epoch];
      sp.first = sp.acks == 0 ? a.at : std::min(sp.first, a.at);
      sp.last = sp.acks == 0 ? a.at : std::max(sp.last, a.at);
      ++sp.acks;
    }
  }
  size_t changes = 0;
  for (const auto& [range, epochs] : ranges) {
    changes += epochs.size() - 1;
    for (auto lower = epochs.begin(); lower != epochs.end(); ++lower) {
      for (auto higher = std::next(lower); higher != epochs.end(); ++higher) {
        if (lower->second.last <= higher->second.first) continue;
        size_t late = 0;
        for (const Ack& a : all_acks_) {
          for (const auto& [r, e] : a.epochs) {
            late += r == range && e == lower->first && a.at > higher->second.first;
          }
        }
        v.pass = false;
        v.detail += fmt::format(
            "range of shard {}: {} push(es) acknowledged at epoch {} after the first at epoch {} "
            "({:.3f}), the last {:.3f} s after it; ",
            range, late, lower->first, higher->first, higher->second.first,
            lower->second.last - higher->second.first);
      }
    }
  }
  if (ranges.empty()) {
    v.applicable = false;
    v.detail = "no journal names an epoch";
  } else if (v.pass) {
    v.detail = fmt::format(
        "{} range(s), {} change(s) of epoch: every acknowledgement at an epoch came before the "
        "first at a higher one",
        ranges.size(), changes);
  }
  verdicts_.push_back(v);
}

void Runner::CheckProgress() {
  const Invariants& inv = s_.invariants;
  Verdict v{"progress_within", "progress after each fault heals", true, ""};
  for (double h : heals_) {
    if (h > t0_ + s_.seconds - 2) continue;  // no time left to show progress
    const double until = std::min(h + inv.progress_within, t0_ + s_.seconds);
    // Training moved: pushes of real batches (not empty ones) were
    // acknowledged at two clocks or more. One clock is not enough: a
    // barrier stuck at clock C still takes each live worker's push of C
    // (a newcomer's too) before their pulls of C + 1 wait forever.
    std::set<uint64_t> clocks;
    for (const Ack& a : all_acks_) {
      if (a.at > h && a.at <= until && a.samples > 0) clocks.insert(a.clock);
    }
    const bool moved = clocks.size() >= 2;
    if (!moved) {
      v.pass = false;
      v.detail += fmt::format("no acknowledged batch in the {:.0f} s after t+{:.1f}s; ", until - h,
                              h - t0_);
    }
  }
  if (v.pass)
    v.detail =
        fmt::format("{} heal point(s), {} acknowledged pushes", heals_.size(), all_acks_.size());
  verdicts_.push_back(v);
}

void Runner::CheckNoCrash() {
  Verdict v{"no_crash", "no process crashes", true, ""};
  for (Proc* p : All()) {
    if (p->killed_on_purpose || p->stopped || p->hung || p->name().rfind("pacerctl", 0) == 0 ||
        p->name() == "evaluate") {
      continue;
    }
    if (p->exit_code() && *p->exit_code() != 0 && p->ended() < end_of_run_ + 60) {
      v.pass = false;
      v.detail += fmt::format("{} exited with {}; ", p->name(), *p->exit_code());
    }
  }
  if (v.pass) v.detail = "every process not killed on purpose exited 0";
  verdicts_.push_back(v);
}

void Runner::CheckNoHang() {
  Verdict v{"no_hang", "no process hangs", true, ""};
  for (const auto& h : hung_) {
    v.pass = false;
    v.detail += h + " still running 20 s after the job stopped; ";
  }
  if (v.pass) v.detail = "every process left after the job stopped";
  verdicts_.push_back(v);
}

void Runner::CheckLostBound() {
  Verdict v{"lost_bound", "lost updates within the bound", true, ""};
  // Per shard: the pushes the runner saw acknowledged before the shard's
  // last scrape, against the pushes its parameters hold at that scrape
  // (every acknowledged push went to every shard and was applied before
  // its ack was journaled). The difference was lost. The bound, from the
  // scenario's settings rather than the shard's own account: a kill may
  // lose what was acknowledged in the checkpoint interval before it, plus
  // the checkpoint's write (twice any slow_disk delay) and 2 s for clocks
  // still open at the snapshot.
  const double window = s_.checkpoint_interval + 2 * max_disk_delay_ + 2;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const Proc* p = shards_[i];
    if (p != nullptr && p->drained) continue;  // its keys and their history moved away
    if (std::any_of(ledgers_.begin(), ledgers_.end(),
                    [&](const LedgerBlock& b) { return b.shard == i && b.deposed; })) {
      // Cut off while its range failed over: the range's history went on
      // at the promoted backup (durable_kept and acked_kept judge it).
      v.detail += fmt::format("shard{}: deposed by a failover, judged by its successor; ", i);
      continue;
    }
    const auto model = p == nullptr ? std::nullopt : Last(p->last, "pacer_shard_model_updates");
    if (!model) {
      v.pass = false;
      v.detail += fmt::format("shard{}: never scraped; ", i);
      continue;
    }
    double acked = 0;
    for (const Ack& a : all_acks_) acked += a.at >= p->counts_from && a.at < model->at;
    const double held = model->value;
    const double lost = std::max(0.0, acked - held);
    double bound = 0;
    for (const Kill& k : shard_kills_) {
      if (k.shard != i) continue;
      for (const Ack& a : all_acks_) bound += (a.at >= k.at - window && a.at <= k.at + 0.5);
    }
    const double reported = Seen(p, "pacer_shard_lost_updates_total", {}, /*own_only=*/true);
    if (lost > bound) {
      v.pass = false;
      v.detail += fmt::format("shard{}: {} acknowledged, {} held: {} lost, bound {}; ", i, acked,
                              held, lost, bound);
    } else if (lost > 0 || reported > 0) {
      // Two counts, made differently: the runner's, acknowledged pushes
      // (up to the shard's last scrape) its update counter does not hold;
      // the shard's, the gap in each worker's push sequence numbers at
      // its first push after the restore. A push acknowledged between
      // the last scrape and the kill is in the shard's count only.
      v.detail += fmt::format(
          "shard{}: {} acknowledged pushes lost, within the bound of {} (those acknowledged in "
          "the checkpoint window before a kill); the shard itself counted {} (from sequence-"
          "number gaps after its restore, which also covers pushes acknowledged after its last "
          "scrape); ",
          i, lost, bound, reported);
    }
  }
  if (v.pass && v.detail.empty()) v.detail = "no shard lost an acknowledged push";
  verdicts_.push_back(v);
}

void Runner::CheckNoDoubleApply() {
  Verdict v{"no_double_apply", "no push applied twice", true, ""};
  // A shard folds each acknowledged push in once: what it had applied at
  // its last scrape is at most what was acknowledged from its start to the
  // end of that scrape, plus one push per worker in flight. A restarted
  // shard of a replicated job also applies the pushes its workers send it
  // again (acknowledged before it started, not yet durable then): those
  // sent to its own range at its address.
  std::vector<std::string> worker_logs;
  for (Proc* p : All()) {
    if (p->name().rfind("worker", 0) == 0) worker_logs.push_back(dir_ + "/" + p->name() + ".log");
  }
  for (Proc* p : All()) {
    if (p->name().rfind("shard", 0) != 0) continue;
    const auto counted = Last(p->last, "pacer_shard_updates_applied_total");
    if (!counted) continue;  // never answered a scrape: nothing to compare
    const double applied = counted->value;
    double acked = 0;
    for (const Ack& a : all_acks_) acked += (a.at >= p->started() && a.at <= counted->done);
    double slack = static_cast<double>(workers_.size());
    double resent = 0;
    const size_t i = std::strtoul(p->name().c_str() + 5, nullptr, 10);
    if (i < shard_ids_.size()) {
      for (const std::string& log : worker_logs) {
        resent += PushesResentTo(log, shard_ids_[i], p->address);
      }
      slack += resent;
    }
    if (applied > acked + slack) v.pass = false;
    v.detail += fmt::format("{} applied {} pushes, {} acknowledged while it ran{}; ", p->name(),
                            applied, acked,
                            resent > 0 ? fmt::format(" and {} sent to it again", resent) : "");
  }
  // Replicated jobs: the ledgers (every (worker, seq) applied, carried
  // from primary to backup) count each push applied again.
  for (const auto& [range, f] : FinalPrimaries(ledgers_)) {
    if (f == nullptr) continue;
    if (f->doubles > 0) v.pass = false;
    v.detail += fmt::format("range of shard {}: {} of {} pushes in its final ledger applied twice; ",
                            range, f->doubles, f->pushes);
  }
  v.detail += fmt::format(
      "{} (a shard may have applied up to {} more than were acknowledged: one push per worker "
      "whose reply was still on its way at the last scrape)",
      v.pass ? "none applied twice" : "some applied twice", workers_.size());
  verdicts_.push_back(v);
}

void Runner::CheckFinalAccuracy() {
  const Invariants& inv = s_.invariants;
  Verdict v{"final_accuracy", "final test accuracy", true, ""};
  v.pass = accuracy_ && *accuracy_ >= inv.final_accuracy;
  v.detail = accuracy_ ? fmt::format("{:.4f} (threshold {})", *accuracy_, inv.final_accuracy)
                       : "no model could be exported and evaluated";
  if (!v.pass) {
    // What training looked like, so that a failure can be explained from
    // the test's output alone: the monitor's last evaluations and each
    // shard's closing counts (steps, stale pushes).
    const std::string trail = LastLinesWith(dir_ + "/monitor.log", "test accuracy", "clock ", 6);
    v.detail += "; the monitor's last evaluations: " + (trail.empty() ? "none" : trail);
    for (Proc* p : shards_) {
      const std::string last = LastLinesWith(dir_ + "/" + p->name() + ".log", "final: ", "final: ", 1);
      if (!last.empty()) v.detail += "; " + p->name() + " " + last;
    }
  }
  verdicts_.push_back(v);
}

void Runner::CheckFaultsInMetrics() {
  Verdict v{"faults_in_metrics", "every injected fault shows in the metrics", true, ""};
  for (const Injected& inj : injected_) {
    double count = 0;
    for (Proc* p : inj.procs) {
      for (const auto& k : inj.kinds)
        count += Seen(p, "pacer_faults_injected_total", {"kind=\"" + k + "\""});
    }
    if (count <= 0) {
      v.pass = false;
      v.detail += inj.what + ": no pacer_faults_injected_total; ";
    }
  }
  for (const auto& [metric, why] : expect_monitor_) {
    double count = 0;
    const auto brace = metric.find('{');
    const std::string name = metric.substr(0, brace);
    std::vector<std::string> labels;
    if (brace != std::string::npos)
      labels.push_back(metric.substr(brace + 1, metric.size() - brace - 2));
    for (Proc* p : All()) {
      if (p->name().rfind("monitor", 0) == 0) count += Seen(p, name, labels);
    }
    if (count <= 0) {
      v.pass = false;
      v.detail += why + ": " + metric + " never rose; ";
    }
  }
  if (v.pass)
    v.detail = fmt::format("{} fault(s), {} process event(s) seen", injected_.size(),
                           expect_monitor_.size());
  if (injected_.empty() && expect_monitor_.empty()) {
    v.applicable = false;
    v.detail = "the scenario injected no fault: nothing to check";
  }
  verdicts_.push_back(v);
}

bool Runner::Report() {
  auto expected = [&](const Verdict& v) {
    return std::find(s_.expect_fail.begin(), s_.expect_fail.end(), v.key) != s_.expect_fail.end();
  };
  std::printf("scenario %s\n", s_.name.c_str());
  bool ok = true;
  for (const std::string& key : s_.expect_fail) {
    if (std::none_of(verdicts_.begin(), verdicts_.end(),
                     [&](const Verdict& v) { return v.key == key; })) {
      ok = false;
      std::printf("FAIL  %s: expected to fail, but not checked\n", key.c_str());
    }
  }
  for (const Verdict& v : verdicts_) {
    const bool want_fail = expected(v);
    if (!v.applicable) {
      ok &= !want_fail;
      std::printf("N/A   %s: %s%s\n", v.name.c_str(), v.detail.c_str(),
                  want_fail ? " (expected to FAIL, but not applicable)" : "");
      continue;
    }
    ok &= v.pass != want_fail;
    std::printf("%s  %s: %s%s\n", v.pass ? "PASS" : "FAIL", v.name.c_str(), v.detail.c_str(),
                want_fail ? (v.pass ? " (expected to FAIL: the handling this scenario switches off "
                                      "was not caught)"
                                    : " (expected: this scenario switches its handling off)")
                          : "");
  }
  std::printf("%s (logs in %s)\n", ok ? "scenario passed" : "scenario FAILED", dir_.c_str());
  std::fflush(stdout);
  return ok;
}

}  // namespace pacer::chaos
