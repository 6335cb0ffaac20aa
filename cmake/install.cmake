# cmake --install: the kiln command (and kiln-train), the public headers, the
# libraries and a package config, so that another project can say
#   find_package(kiln 0.1 REQUIRED)            # kiln::core, and the parts built
#   target_link_libraries(app PRIVATE kiln::core)
# One export set per part: a project that wants only kiln::core does not
# need OpenCV or LibTorch installed (kilnConfig.cmake loads a part only when
# its dependencies are found, or fails when the part was asked for with
# COMPONENTS).
#
# The libraries are static, so their PRIVATE dependencies (LMDB, xxHash,
# TBB, nlohmann_json, libjpeg; OpenCV and TurboJPEG for kiln::ingest) are part of the
# link interface: the config finds them again the way this file's project did.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

set_target_properties(kiln_core PROPERTIES EXPORT_NAME core)
# kiln::pixels (the resampler) is linked into core and image: a static
# library's PRIVATE dependency, so it travels in core's export set.
set_target_properties(kiln_pixels PROPERTIES EXPORT_NAME pixels)
install(TARGETS kiln_core kiln_pixels EXPORT kilnCoreTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "image" EXCLUDE PATTERN "ingest" EXCLUDE
        PATTERN "train" EXCLUDE)
install(EXPORT kilnCoreTargets NAMESPACE kiln:: FILE kilnCoreTargets.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})
install(TARGETS kiln RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# kiln plot runs this script from beside kiln.
install(PROGRAMS ${PROJECT_BINARY_DIR}/kiln-plot DESTINATION ${CMAKE_INSTALL_BINDIR})

set(KILN_INSTALLED_PARTS "")
if(KILN_WITH_IMAGE)
  list(APPEND KILN_INSTALLED_PARTS ingest)
  set_target_properties(kiln_image PROPERTIES EXPORT_NAME image)
  set_target_properties(kiln_ingest PROPERTIES EXPORT_NAME ingest)
  set_target_properties(kiln_merge PROPERTIES EXPORT_NAME merge)
  install(TARGETS kiln_image kiln_merge kiln_ingest EXPORT kilnIngestTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  # kiln::image opens it on first use (src/image/opencv_codecs.h).
  install(TARGETS kiln_opencv_codecs LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/kiln)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln/image ${PROJECT_SOURCE_DIR}/include/kiln/ingest
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
  install(EXPORT kilnIngestTargets NAMESPACE kiln:: FILE kilnIngestTargets.cmake
          DESTINATION ${KILN_INSTALL_CMAKEDIR})
endif()
if(KILN_WITH_TORCH)
  list(APPEND KILN_INSTALLED_PARTS train)
  set_target_properties(kiln_train PROPERTIES EXPORT_NAME train)
  install(TARGETS kiln_train EXPORT kilnTrainTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln/train DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
  install(EXPORT kilnTrainTargets NAMESPACE kiln:: FILE kilnTrainTargets.cmake
          DESTINATION ${KILN_INSTALL_CMAKEDIR})
  # LibTorch may live outside the linker's default paths (a PyTorch wheel):
  # the installed kiln-train keeps the directories it was linked with.
  set_target_properties(kiln-train PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS kiln-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})
