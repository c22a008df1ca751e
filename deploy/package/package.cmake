# Installation and the Debian package (cpack -G DEB), included from the top
# CMakeLists.txt. The package installs:
#   /usr/bin                    pacer-server, pacer-monitor, pacer-worker, pacerctl,
#                               pacer-run
#   /usr/lib/pacer              libpacer_cuda.so, the CUDA backend (built with nvcc only)
#   /usr/lib/systemd/system     the units of deploy/systemd
#   /etc/pacer                  default settings (deploy/config; conffiles)
#   /usr/include/pacer          the client and worker libraries' headers
#   /usr/lib                    their static libraries, and
#   /usr/lib/cmake/Pacer        a CMake package config: find_package(Pacer)
#   /usr/share/pacer            the Grafana dashboard, Prometheus rules and configs
#   /usr/share/doc/pacer        README and the manuals it links to, runbooks, and an
#                               example program
# and a second package, python3-pacer (where pybind11-dev built the module):
#   /usr/lib/python3/dist-packages/pacer   pacer._core and pacer.torch
#   /usr/share/doc/python3-pacer/examples  worker/python/examples
# so that servers need not pull in torch.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Every install rule below without a COMPONENT is the pacer package's.
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME pacer)

install(TARGETS pacer-server pacer-monitor pacer-worker pacerctl pacer-run pacer-chaos
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The CUDA backend, loaded by pacer-worker with dlopen (worker/builtin/cuda_dl.cc
# looks in ../lib/pacer from the program), when nvcc built it. It needs
# CUDA's libcublas.so.13 at run time, which no Debian package provides:
# dpkg-shlibdeps is shown CUDA's library folder and adds no dependency for it.
if(TARGET pacer_cuda_module)
  install(TARGETS pacer_cuda_module LIBRARY DESTINATION lib/pacer)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR})
endif()

install(TARGETS pacer_ps pacer_model pacer_trainer pacer_worker pacer_worker_compute pacer_cuda_dl
  EXPORT PacerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pacer)
set_target_properties(pacer_ps PROPERTIES EXPORT_NAME ps)
set_target_properties(pacer_model PROPERTIES EXPORT_NAME model)
set_target_properties(pacer_trainer PROPERTIES EXPORT_NAME trainer)
set_target_properties(pacer_worker PROPERTIES EXPORT_NAME worker)
set_target_properties(pacer_worker_compute PROPERTIES EXPORT_NAME worker_compute)
set_target_properties(pacer_cuda_dl PROPERTIES EXPORT_NAME cuda_dl)
install(EXPORT PacerTargets NAMESPACE Pacer::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Pacer)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/PacerConfig.cmake.in
  ${CMAKE_BINARY_DIR}/PacerConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Pacer)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/PacerConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/PacerConfig.cmake ${CMAKE_BINARY_DIR}/PacerConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Pacer)

# Headers, as the sources include them: "ps/client.h", "worker/worker.h".
install(DIRECTORY ${PROJECT_SOURCE_DIR}/ps/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pacer/ps
  FILES_MATCHING PATTERN "*.h" PATTERN "schema" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/worker/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pacer/worker
  FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/ps/gen/ps/pacer_generated.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pacer/ps)

set(PACER_DEPLOY ${PROJECT_SOURCE_DIR}/deploy)
install(FILES ${PACER_DEPLOY}/systemd/pacer-monitor.service
  ${PACER_DEPLOY}/systemd/pacer-server@.service ${PACER_DEPLOY}/systemd/pacer-worker@.service
  DESTINATION lib/systemd/system)
install(FILES ${PACER_DEPLOY}/config/monitor.toml ${PACER_DEPLOY}/config/server.toml
  ${PACER_DEPLOY}/config/worker.toml DESTINATION /etc/pacer)
install(FILES ${PACER_DEPLOY}/grafana/pacer-dashboard.json ${PACER_DEPLOY}/grafana/README.md
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer/grafana)
install(DIRECTORY ${PACER_DEPLOY}/grafana/provisioning
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer/grafana)
install(FILES ${PACER_DEPLOY}/prometheus/pacer.rules.yml ${PACER_DEPLOY}/prometheus/prometheus.yml
  ${PACER_DEPLOY}/prometheus/prometheus-kubernetes.yml
  DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer/prometheus)
install(PROGRAMS ${PACER_DEPLOY}/make-keys.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PACER_DEPLOY}/prometheus/RUNBOOKS.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The manuals the README links to, where its links find them.
foreach(manual deploy deploy/k8s deploy/grafana ps monitor worker worker/python tests tests/chaos
        bench)
  install(FILES ${PROJECT_SOURCE_DIR}/${manual}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/${manual})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/bench/RESULTS.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/bench)
install(FILES ${PACER_DEPLOY}/prometheus/RUNBOOKS.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/deploy/prometheus)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/example/CMakeLists.txt
  ${CMAKE_CURRENT_LIST_DIR}/example/train_logistic.cc ${CMAKE_CURRENT_LIST_DIR}/example/blobs.csv
  DESTINATION ${CMAKE_INSTALL_DOCDIR}/example)

# The python component's install rules are in worker/python/CMakeLists.txt.
set(CPACK_PACKAGE_NAME pacer)
set(CPACK_PACKAGE_VENDOR "Pacer")
set(CPACK_PACKAGE_CONTACT "Pacer developers <pacer@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Elastic, straggler-tolerant parameter server (shards, monitor, workers, pacerctl)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Run-time libraries from dpkg-shlibdeps; building against the headers needs
# the -dev packages, recommended.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
  "libzmq3-dev, cppzmq-dev, libflatbuffers-dev, librocksdb-dev, prometheus-cpp-dev, libabsl-dev, libspdlog-dev, libcli11-dev, libeigen3-dev, libopenblas-dev, zlib1g-dev, libisal-dev, libxxhash-dev, dataset-fashion-mnist")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "prometheus, grafana")
# /etc/pacer's settings are conffiles: an upgrade keeps local edits.
set(CPACK_DEBIAN_PACER_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# One .deb per component: pacer, and python3-pacer for Debian's Python 3
# (its run-time libraries from dpkg-shlibdeps, as for pacer).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL pacer)
set(CPACK_DEBIAN_PACER_PACKAGE_NAME pacer)
if(TARGET pacer_core)
  list(APPEND CPACK_COMPONENTS_ALL python)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-pacer)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
  # The module is built for one Python (its ABI tag): that minor version.
  get_property(py GLOBAL PROPERTY PACER_PYTHON_VERSION)
  string(REPLACE "." ";" py_parts "${py}")
  list(GET py_parts 0 py_major)
  list(GET py_parts 1 py_minor)
  math(EXPR py_next "${py_minor} + 1")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3 (>= ${py}), python3 (<< ${py_major}.${py_next}), python3-numpy, python3-torch")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "pacer")
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "")
  set(CPACK_COMPONENT_PYTHON_DESCRIPTION
    "Pacer's Python package: train your own PyTorch model with Pacer (pacer.torch)")
endif()
include(CPack)
