// The monitor's journal: whether its state changed in a way worth saving at
// once (before the reply that tells anyone about it goes out). Each part of
// the monitor marks it; MonitorServer takes the mark and saves (--data-dir),
// besides its periodic save. Used by the monitor's one thread.
#ifndef PACER_MONITOR_JOURNAL_H_
#define PACER_MONITOR_JOURNAL_H_

namespace pacer {

class Journal {
 public:
  // Something worth saving at once changed.
  void Mark() { dirty_ = true; }
  // Whether it did since the last call (a new monitor's state: yes).
  bool Take() {
    const bool d = dirty_;
    dirty_ = false;
    return d;
  }

 private:
  bool dirty_ = true;
};

}  // namespace pacer

#endif  // PACER_MONITOR_JOURNAL_H_
