# Tests for worker/builtin/mnist and worker/builtin/cpu_backend. Included from
# tests/CMakeLists.txt; needs GTest and the pacer_worker_compute target.
# Both tests read Debian's fashion-mnist package (/usr/share/datasets/fashion-mnist).

foreach(pacer_compute_test mnist_test cpu_backend_test cnn_backend_test cuda_backend_test)
  add_executable(${pacer_compute_test} ${CMAKE_CURRENT_LIST_DIR}/${pacer_compute_test}.cc)
  target_link_libraries(${pacer_compute_test} PRIVATE pacer_worker_compute GTest::gtest_main)
  add_test(NAME ${pacer_compute_test} COMMAND ${pacer_compute_test})
  set_tests_properties(${pacer_compute_test} PROPERTIES LABELS unit TIMEOUT 120)
endforeach()
# The CUDA backend (or, without nvcc, its stand-in) for its own test.
target_link_libraries(cuda_backend_test PRIVATE pacer_cuda)
# mnist_test writes its own .gz fixtures.
target_link_libraries(mnist_test PRIVATE ZLIB::ZLIB)
