// The gradient sink of a layer-wise push (one of the trainer's rooms,
// worker/trainer.cc), header-only: it is a few lines around PsClient's
// PushStage.
#ifndef PACER_WORKER_LAYER_PUSHER_H_
#define PACER_WORKER_LAYER_PUSHER_H_

#include <vector>

#include "absl/status/status.h"
#include "ps/base/clock.h"
#include "ps/client.h"
#include "worker/model.h"

namespace pacer::worker {

// The gradient sink of a layer-wise push: sends each layer's part as the
// backward pass finishes it. Straggler emulation stretches the compute
// before each part (and the rest after the pass, Finish) by `factor`. An
// asynchronous backend's reports are not timed on this thread, so under a
// slowdown its parts are held until the whole pass is stretched (`defer`).
struct LayerPusher : GradientSink {
  LayerPusher(PsClient& c, const Clock& clk, double f, bool hold)
      : client(c), clock(clk), factor(f), defer(hold && f > 1.0), mark(clk.Now()) {}
  void Ready(size_t stage) override {
    if (defer) {
      held.push_back(stage);
      return;
    }
    Stretch();
    Send(stage);
  }
  // After the pass: the rest of the compute stretched, held parts sent.
  void Finish() {
    Stretch();
    for (size_t stage : held) Send(stage);
    held.clear();
  }
  void Send(size_t stage) {
    if (!error.ok()) return;  // FinishPush is skipped; the caller sends it all again
    const TimePoint start = clock.Now();
    const uint64_t before = client.push_messages();
    error = client.PushStage(stage);
    if (client.push_messages() > before && !early) {
      early = true;
      first_sent = start;
    }
    mark = clock.Now();
    sending += mark - start;
  }
  // Sleeps (factor - 1) times the compute since the last mark.
  void Stretch() {
    const TimePoint now = clock.Now();
    if (factor > 1.0) {
      clock.SleepUntil(now + std::chrono::duration_cast<Duration>((now - mark) * (factor - 1.0)));
    }
    mark = clock.Now();
  }
  PsClient& client;
  const Clock& clock;
  const double factor;
  const bool defer;
  TimePoint mark;
  std::vector<size_t> held;
  absl::Status error;
  bool early = false;  // a part went out before the pass ended
  TimePoint first_sent{};
  Duration sending{};  // time in PushStage (communication, not compute)
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_LAYER_PUSHER_H_
