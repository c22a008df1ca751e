# The worker's data loader and CPU compute backend. Included from
# worker/CMakeLists.txt; expects the top level to have run
# find_package(absl CONFIG), find_package(ZLIB), find_package(Eigen3 CONFIG)
# and find_package(OpenBLAS CONFIG).

get_filename_component(PACER_COMPUTE_REPO_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

add_library(pacer_worker_compute STATIC
  ${CMAKE_CURRENT_LIST_DIR}/mnist.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_cnn.cc
  ${CMAKE_CURRENT_LIST_DIR}/model.cc
)
# Headers are included as "worker/mnist.h", "worker/cpu_backend.h".
target_include_directories(pacer_worker_compute PUBLIC
  $<BUILD_INTERFACE:${PACER_COMPUTE_REPO_ROOT}> $<INSTALL_INTERFACE:include/pacer>)
target_include_directories(pacer_worker_compute SYSTEM PRIVATE ${OpenBLAS_INCLUDE_DIRS})
# Only cpu_backend.cc uses Eigen and no public header exposes it, so the BLAS
# switch can stay private without two definitions of Eigen's templates meeting.
target_compile_definitions(pacer_worker_compute PRIVATE EIGEN_USE_BLAS)
target_link_libraries(pacer_worker_compute
  PUBLIC absl::statusor absl::status
  # Link OpenBLAS by full path (from OpenBLASConfig.cmake), never the
  # libblas.so alternative, which may be Debian's slow reference BLAS.
  PRIVATE ZLIB::ZLIB Eigen3::Eigen ${OpenBLAS_LIBRARIES}
)
