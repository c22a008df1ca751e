// Test helpers for multi-process tests: processes (Process, TempDir,
// ReadFile: tests/process/process.h) and /metrics (ps/base/scrape.h).
#ifndef PACER_TESTS_PROCESS_UTIL_H_
#define PACER_TESTS_PROCESS_UTIL_H_

#include "ps/base/scrape.h"
#include "tests/process/process.h"

namespace pacer::test {

// HTTP and /metrics helpers live in ps/base/scrape.h (the chaos runner uses them).
using pacer::FetchMetrics;
using pacer::HttpGet;
using pacer::HttpResponse;
using pacer::MetricValue;
using pacer::UrlEncode;

}  // namespace pacer::test

#endif  // PACER_TESTS_PROCESS_UTIL_H_
