# The model interfaces (pacer_model) and the built-in models and data
# (worker/builtin/): the Fashion-MNIST loader, the CPU and CUDA backends. Included from
# worker/CMakeLists.txt; expects the top level to have run
# find_package(absl CONFIG), find_package(ZLIB), find_package(Eigen3 CONFIG)
# and find_package(OpenBLAS CONFIG).

get_filename_component(PACER_COMPUTE_REPO_ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# The model interfaces (worker/model.h) on their own: the runtime and the
# Python module need them without the built-in models' BLAS.
add_library(pacer_model STATIC ${PACER_COMPUTE_REPO_ROOT}/worker/model.cc)
target_include_directories(pacer_model PUBLIC
  $<BUILD_INTERFACE:${PACER_COMPUTE_REPO_ROOT}> $<INSTALL_INTERFACE:include/pacer>)
set_target_properties(pacer_model PROPERTIES POSITION_INDEPENDENT_CODE ON)

add_library(pacer_worker_compute STATIC
  ${CMAKE_CURRENT_LIST_DIR}/mnist.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_cnn.cc
  ${CMAKE_CURRENT_LIST_DIR}/models.cc
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cc
)
# Headers are included as "worker/builtin/mnist.h", "worker/model.h".
target_include_directories(pacer_worker_compute PUBLIC
  $<BUILD_INTERFACE:${PACER_COMPUTE_REPO_ROOT}> $<INSTALL_INTERFACE:include/pacer>)
target_include_directories(pacer_worker_compute SYSTEM PRIVATE ${OpenBLAS_INCLUDE_DIRS})
# Only cpu_backend.cc uses Eigen and no public header exposes it, so the BLAS
# switch can stay private without two definitions of Eigen's templates meeting.
target_compile_definitions(pacer_worker_compute PRIVATE EIGEN_USE_BLAS)
target_link_libraries(pacer_worker_compute
  PUBLIC pacer_model absl::statusor absl::status
  # Link OpenBLAS by full path (from OpenBLASConfig.cmake), never the
  # libblas.so alternative, which may be Debian's slow reference BLAS.
  PRIVATE ZLIB::ZLIB Eigen3::Eigen ${OpenBLAS_LIBRARIES}
)

# The CUDA backend (worker/builtin/cuda_backend.h) is a library of its own,
# pacer_cuda: compiled where nvcc is (the top level's PACER_HAVE_CUDA),
# else its no-device stand-in. pacer_cuda_none is the stand-in always; a
# program picks one. Both hold --device and the batch-limit model
# (device.cc), which call the one they come with.
#
# pacer-worker links pacer_cuda_dl, which loads the backend from the module
# libpacer_cuda.so (pacer_cuda_module) with dlopen when first asked for:
# cuBLAS linked at start broke civetweb's threads (worker/builtin/cuda_dl.cc).
add_library(pacer_cuda_none STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_none.cc
  ${CMAKE_CURRENT_LIST_DIR}/device.cc)
target_link_libraries(pacer_cuda_none PUBLIC pacer_worker_compute)
if(PACER_HAVE_CUDA)
  add_library(pacer_cuda STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cu
    ${CMAKE_CURRENT_LIST_DIR}/device.cc)
  target_include_directories(pacer_cuda PRIVATE ${PACER_COMPUTE_REPO_ROOT})
  # The runtime statically (a bare GPU machine has no CUDA libraries);
  # cuBLAS has no static library here, so libcublas.so.13 and
  # libcublasLt.so.13 travel with the binaries to such a machine.
  target_link_libraries(pacer_cuda PUBLIC pacer_worker_compute PRIVATE CUDA::cudart_static CUDA::cublas)
  # The same backend as a module for dlopen: libpacer_cuda.so beside the
  # worker's binary folder (build/worker/), with its own copy of model.cc.
  add_library(pacer_cuda_module MODULE ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cu
    ${CMAKE_CURRENT_LIST_DIR}/models.cc ${PACER_COMPUTE_REPO_ROOT}/worker/model.cc)
  set_target_properties(pacer_cuda_module PROPERTIES OUTPUT_NAME pacer_cuda)
  target_include_directories(pacer_cuda_module PRIVATE ${PACER_COMPUTE_REPO_ROOT})
  target_link_libraries(pacer_cuda_module PRIVATE CUDA::cudart_static CUDA::cublas)
else()
  add_library(pacer_cuda ALIAS pacer_cuda_none)
endif()
add_library(pacer_cuda_dl STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_dl.cc
  ${CMAKE_CURRENT_LIST_DIR}/device.cc)
target_link_libraries(pacer_cuda_dl PUBLIC pacer_worker_compute PRIVATE ${CMAKE_DL_LIBS})
if(PACER_HAVE_CUDA)
  add_dependencies(pacer_cuda_dl pacer_cuda_module)
endif()
