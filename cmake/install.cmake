# `cmake --install`: anvil as a library for other CMake projects, as LibTorch
# is one. It installs
#   include/anvil/{core,data,nn,...}/*.h  the public headers (they include
#                                         each other as "core/tensor.h")
#   lib/libanvil.a                        the library, built for this machine
#   lib/cmake/anvil/                      the package: find_package(anvil)
#                                         gives the target anvil::anvil
#   bin/anvil-train
# Another project then writes
#   find_package(anvil REQUIRED)
#   target_link_libraries(app PRIVATE anvil::anvil)
# and includes <anvil/nn/layers.h> (or "nn/layers.h"). docs/library.md.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(anvil::anvil ALIAS anvil)
# Both include/anvil (the headers' own includes) and include (<anvil/...>).
target_include_directories(anvil PUBLIC
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/anvil>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# Every header of the library's folders (a folder a later option adds, such
# as parallel/, is installed once it exists).
foreach(dir core data nn parallel)
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/anvil/${dir} FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()

install(TARGETS anvil EXPORT anvilTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS anvil-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The packages anvil::anvil needs found again in the project that uses it:
# the ones anvil links (all of them: a static library passes its private
# dependencies on at link time), with the optional parts this build has.
set(ANVIL_PACKAGE_DEPENDENCIES "OpenMP" "Threads" "fmt" "nlohmann_json" "ZLIB" "OpenBLAS CONFIG")
if(ANVIL_CUDA_MODE STREQUAL "CUDA")
  list(APPEND ANVIL_PACKAGE_DEPENDENCIES "CUDAToolkit")
elseif(ANVIL_CUDA_MODE STREQUAL "SIM")
  list(APPEND ANVIL_PACKAGE_DEPENDENCIES "Boost COMPONENTS context")
endif()
if(TARGET MPI::MPI_CXX)
  list(APPEND ANVIL_PACKAGE_DEPENDENCIES "MPI COMPONENTS CXX")
endif()

set(ANVIL_PACKAGE_DEPENDENCIES_QUOTED "")
foreach(dependency IN LISTS ANVIL_PACKAGE_DEPENDENCIES)
  string(APPEND ANVIL_PACKAGE_DEPENDENCIES_QUOTED " \"${dependency}\"")
endforeach()

set(ANVIL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/anvil)
install(EXPORT anvilTargets NAMESPACE anvil:: DESTINATION ${ANVIL_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/anvilConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/anvilConfig.cmake INSTALL_DESTINATION ${ANVIL_CMAKE_DIR})
# 0.x: any minor version may change the API (docs/library.md).
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/anvilConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/anvilConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/anvilConfigVersion.cmake
        DESTINATION ${ANVIL_CMAKE_DIR})
