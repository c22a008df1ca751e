# Unit tests of ps/ and monitor/ (in-process, fake clock). Uses pacer_test() from CMakeLists.txt.
pacer_test(wire_test unit pacer_ps ZLIB::ZLIB)
pacer_test(shard_test unit pacer_ps)
pacer_test(partition_test unit pacer_ps)
pacer_test(client_test unit pacer_ps)
pacer_test(monitor_test unit pacer_monitor)
pacer_test(policy_test unit pacer_monitor)
pacer_test(staleness_test unit pacer_ps)
pacer_test(straggler_test unit pacer_worker)
