# Tests that run real processes on 127.0.0.1, and the in-process cluster.
add_library(pacer_test_util INTERFACE)
target_link_libraries(pacer_test_util INTERFACE GTest::gtest pacer_process pacer_ps)
target_compile_definitions(pacer_test_util INTERFACE
  PACER_SERVER_BIN="$<TARGET_FILE:pacer-server>"
  PACER_MONITOR_BIN="$<TARGET_FILE:pacer-monitor>"
  PACER_WORKER_BIN="$<TARGET_FILE:pacer-worker>"
  PACERCTL_BIN="$<TARGET_FILE:pacerctl>")

foreach(t cluster_test straggler_cluster_test bad_input_test help_test)
  pacer_test(${t} cluster pacer_test_util pacer_ps)
  add_dependencies(${t} pacer-server pacer-monitor pacer-worker)
endforeach()
set_tests_properties(help_test PROPERTIES LABELS unit)
# The help test reads the binaries' --help and the READMEs of the source tree.
add_dependencies(help_test pacerctl pacer-chaos pacer-sim pacer-run)
target_compile_definitions(help_test PRIVATE PACER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  PACER_RUN_BIN="$<TARGET_FILE:pacer-run>"
  PACER_CHAOS_BIN="$<TARGET_FILE:pacer-chaos>" PACER_CHAOS_README="tests/chaos/README.md"
  PACER_SIM_BIN="$<TARGET_FILE:pacer-sim>")

pacer_test(inproc_cluster_test cluster pacer_monitor pacer_worker)

# Crash recovery: shard and monitor processes, workers embedded in the test.
pacer_test(recovery_cluster_test cluster pacer_test_util pacer_worker)
add_dependencies(recovery_cluster_test pacer-server pacer-monitor)

pacer_test(pacerctl_cluster_test cluster pacer_test_util pacer_ps nlohmann_json::nlohmann_json)
add_dependencies(pacerctl_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)
pacer_test(shard_move_cluster_test cluster pacer_test_util pacer_ps nlohmann_json::nlohmann_json)
add_dependencies(shard_move_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)

# Metrics, health, Prometheus (when installed) and SIGTERM on a live cluster.
# Two ctest entries: the tests that need Prometheus's tools apart, so that
# where they are missing ctest reports them skipped rather than passed.
pacer_test(observability_cluster_test cluster pacer_test_util nlohmann_json::nlohmann_json)
add_dependencies(observability_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)
target_compile_definitions(observability_cluster_test PRIVATE
  PACER_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
set_tests_properties(observability_cluster_test PROPERTIES TIMEOUT 600)
set_property(TEST observability_cluster_test APPEND PROPERTY ENVIRONMENT
  "GTEST_FILTER=-*Prometheus*:*Promtool*")
add_test(NAME observability_prometheus_test COMMAND observability_cluster_test
  "--gtest_filter=*Prometheus*:*Promtool*")
set_tests_properties(observability_prometheus_test PROPERTIES LABELS cluster TIMEOUT 600
  SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")

# Fault injection: --faults at start and pacerctl fault at run time.
pacer_test(fault_cluster_test cluster pacer_test_util pacer_ps nlohmann_json::nlohmann_json)
add_dependencies(fault_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)

# Transport security (issue 8): key files and the CURVE transport (unit),
# then a whole cluster with keys.
pacer_test(security_test unit pacer_test_util pacer_ps)
pacer_test(security_cluster_test cluster pacer_test_util pacer_ps)
add_dependencies(security_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)

# The optimizer menu through a 2-shard job against torch's golden runs.
pacer_test(optimizer_cluster_test cluster pacer_test_util pacer_ps)
add_dependencies(optimizer_cluster_test pacer-server pacer-monitor)
target_compile_definitions(optimizer_cluster_test PRIVATE PACER_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Replication (issue 23): --replicas 1, records to the backups, block checks.
pacer_test(replication_cluster_test cluster pacer_test_util pacer_ps nlohmann_json::nlohmann_json)
add_dependencies(replication_cluster_test pacer-server pacer-monitor pacer-worker pacerctl)
