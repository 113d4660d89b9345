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

