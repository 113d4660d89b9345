# What `cmake --install` and the .deb (CPack) ship, and nothing else: the two
# libraries, the tool, the C++ API with its pkg-config file and CMake
# package, and the docs. Tests, benchmarks and examples stay in the build tree.
include(CMakePackageConfigHelpers)

# ---- the libraries, in the private directory (see CMakeLists.txt) ------------
# With their version symlinks and the libibverbs.so / librdmacm.so name links,
# as in build/lib. Our librdmacm.so.1 needs our libibverbs.so.1; $ORIGIN makes
# it find the one beside it even when only this directory's librdmacm was
# named (an absolute path, LD_PRELOAD), not rdma-core's.
set_target_properties(softhca_rdmacm PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS softhca_verbs softhca_rdmacm
        LIBRARY DESTINATION ${SOFTHCA_INSTALL_PRIVATE_LIBDIR})
# The host's CM agent beside them: the CM starts it from the directory of
# the librdmacm.so.1 it runs in (src/cm/agent_launcher.cpp).
install(TARGETS softhca_cm_agent RUNTIME DESTINATION ${SOFTHCA_INSTALL_PRIVATE_LIBDIR})

# ---- the tool ----------------------------------------------------------------
# The installed copy (tools/softhca/CMakeLists.txt); it links our
# libibverbs.so.1 itself for `softhca devices`, found through its RUNPATH.
if(TARGET softhca_installed)
  set_target_properties(softhca_installed PROPERTIES
    INSTALL_RPATH "$ORIGIN/${SOFTHCA_INSTALL_LIBDIR_FROM_BINDIR}")
  install(TARGETS softhca_installed RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# ---- the C++ API: headers, CMake package, pkg-config file --------------------
# find_package(softhca) gives softhca::softhca: the headers, C++23, and
# rdma-core's libibverbs and librdmacm, which softhcaConfig.cmake looks up
# as softhca::ibverbs and softhca::rdmacm before loading the targets. Not
# ours: the API is header-only over the verbs C API, so a program built with
# it runs on a real NIC, and on softhca through `softhca run`.
file(GLOB SOFTHCA_API_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/include/softhca/*.hpp)
add_library(softhca_cxx INTERFACE)
set_target_properties(softhca_cxx PROPERTIES EXPORT_NAME softhca)
target_sources(softhca_cxx INTERFACE
  FILE_SET HEADERS BASE_DIRS ${CMAKE_SOURCE_DIR}/include FILES ${SOFTHCA_API_HEADERS})
target_compile_features(softhca_cxx INTERFACE cxx_std_23)
target_link_libraries(softhca_cxx INTERFACE "$<INSTALL_INTERFACE:softhca::ibverbs;softhca::rdmacm>")
# The header file set gives consumers the include directory from CMake 3.23
# on; said once more for older ones (3.20 knows cxx_std_23).
target_include_directories(softhca_cxx INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set(SOFTHCA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/softhca)
install(TARGETS softhca_cxx EXPORT softhcaTargets
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT softhcaTargets NAMESPACE softhca:: DESTINATION ${SOFTHCA_INSTALL_CMAKEDIR})
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/softhcaConfig.cmake.in
  ${CMAKE_BINARY_DIR}/package/softhcaConfig.cmake
  INSTALL_DESTINATION ${SOFTHCA_INSTALL_CMAKEDIR})
# Header-only, so any architecture will do; SameMinorVersion while the API
# still changes between 0.x releases.
write_basic_package_version_file(
  ${CMAKE_BINARY_DIR}/package/softhcaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_BINARY_DIR}/package/softhcaConfig.cmake
              ${CMAKE_BINARY_DIR}/package/softhcaConfigVersion.cmake
        DESTINATION ${SOFTHCA_INSTALL_CMAKEDIR})

# The .pc file finds its prefix from its own location (${pcfiledir}), so one
# file serves `cmake --install --prefix ANY` and the .deb alike.
file(RELATIVE_PATH SOFTHCA_PC_PREFIX_FROM_PCFILEDIR
     ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" SOFTHCA_PC_PREFIX_FROM_PCFILEDIR "${SOFTHCA_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/softhca.pc.in ${CMAKE_BINARY_DIR}/package/softhca.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/package/softhca.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- docs ----------------------------------------------------------------------
# docs/ too, since the README links into it.
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/LICENSE
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        FILES_MATCHING PATTERN "*.md")

# ---- the .deb: `cpack -G DEB` in the build directory ------------------------------
# Everything under /usr, so the private directory is /usr/lib/softhca and
# /usr/bin/softhca finds it (configuring with CMAKE_INSTALL_PREFIX=/usr makes
# both multiarch: /usr/lib/x86_64-linux-gnu/softhca).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME softhca)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "software RDMA device behind the libibverbs and librdmacm ABI of rdma-core 44")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "softhca is a user-space RDMA HCA: its own libibverbs.so.1 and librdmacm.so.1, with\n"
  "the exported ABI of rdma-core 44, so that unmodified verbs and rdma_cm programs\n"
  "(ibverbs-utils, rdmacm-utils, perftest, your own) run on a machine without an\n"
  "RDMA NIC. Processes of one host talk through shared memory, other hosts through\n"
  "RoCEv2 over UDP.\n"
  "The libraries live in ${CPACK_PACKAGING_INSTALL_PREFIX}/${SOFTHCA_INSTALL_PRIVATE_LIBDIR} and replace rdma-core's only\n"
  "for the programs started with `softhca run PROGRAM`. The package also holds\n"
  "the header-only C++ API (pkg-config softhca, CMake find_package(softhca)).")
set(SOFTHCA_PACKAGE_MAINTAINER "softhca maintainers <maintainers@users.noreply.a-seed-7c93d7b6.example>"
    CACHE STRING "the Maintainer field of the .deb")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${SOFTHCA_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# softhca_<version>_<arch>.deb, as dpkg names packages.
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# dpkg-shlibdeps (dpkg-dev) derives Depends from what the binaries link
# (libc6, libstdc++6, libpcap0.8, libisal2, ...). It follows the $ORIGIN
# RUNPATHs above to the packaged libibverbs.so.1, so rdma-core's libibverbs1
# is not made a dependency: nothing here uses it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The C++ API's headers and pkg-config file need rdma-core's; the programs
# worth running on softhca come from the utils packages.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libibverbs-dev, librdmacm-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "ibverbs-utils, rdmacm-utils, perftest")
# Without debug info: the default RelWithDebInfo build would make the
# package several times larger.
set(CPACK_STRIP_FILES ON)
# CPack also adds postinst/postrm scripts that run ldconfig, because the
# libraries lie below /usr/lib; harmless, since ldconfig does not look into
# the private directory.
include(CPack)
