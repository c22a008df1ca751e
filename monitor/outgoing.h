// A message the monitor sends: to a peer on its ROUTER socket, or on its
// channel to shard `shard_index` (monitor/shard_registry.h's Channel).
#ifndef PACER_MONITOR_OUTGOING_H_
#define PACER_MONITOR_OUTGOING_H_

#include <vector>

#include "ps/base/frame.h"

namespace pacer {

struct MonitorOutgoing {
  Frame peer;
  int shard_index = -1;
  Frames frames;
};

}  // namespace pacer

#endif  // PACER_MONITOR_OUTGOING_H_
