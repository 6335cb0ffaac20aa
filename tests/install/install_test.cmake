# cmake -P install_test.cmake: installs the kiln build in KILN_BUILD_DIR into a
# fresh prefix under WORK_DIR, runs the installed kiln on a synthetic cache
# (SYNTH_CACHE writes it), then configures, builds and runs CONSUMER_DIR (a
# project of its own) against the prefix with find_package(kiln). Fails
# unless the consumer reads back every record of the cache.
foreach(var KILN_BUILD_DIR WORK_DIR CONSUMER_DIR SYNTH_CACHE GENERATOR INSTALL_LIBDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()
# Lists arrive with '|' for ';' (tests/install/CMakeLists.txt).
string(REPLACE "|" ";" EXPECT_PARTS "${EXPECT_PARTS}")
string(REPLACE "|" ";" DEPENDENCY_PREFIX_PATH "${DEPENDENCY_PREFIX_PATH}")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run("cmake --install" ${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${prefix})

set(expected_files bin/kiln include/kiln/loader.h include/kiln/cache_reader.h
    lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake)
foreach(part IN LISTS EXPECT_PARTS)
  if(part STREQUAL "train")
    list(APPEND expected_files bin/kiln-train include/kiln/train/trainer.h)
  elseif(part STREQUAL "ingest")
    list(APPEND expected_files include/kiln/ingest/build.h)
  endif()
endforeach()
foreach(f IN LISTS expected_files)
  string(REGEX REPLACE "^lib/" "${INSTALL_LIBDIR}/" f "${f}")
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()

# 37 records of 3x8x8 uint8 in batches of 8: 4 full batches and one of 5.
set(cache ${WORK_DIR}/cache)
run("kiln_synth_cache" ${SYNTH_CACHE} ${cache} 37 3 8 8 uint8)
run("the installed kiln verify" ${prefix}/bin/kiln verify ${cache})

set(consumer_build ${WORK_DIR}/consumer-build)
# Lists go to the consumer without ';' (a list of arguments would split
# them): the prefixes through the environment, the parts with '|'.
string(REPLACE ";" ":" prefix_path "${prefix};${DEPENDENCY_PREFIX_PATH}")
set(ENV{CMAKE_PREFIX_PATH} "${prefix_path}")
set(parts core ${EXPECT_PARTS})
list(JOIN parts "|" parts)
set(configure ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${consumer_build} -G ${GENERATOR}
    -DKILN_EXPECT_PARTS=${parts})
foreach(var CMAKE_MAKE_PROGRAM CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE CMAKE_CUDA_COMPILER
        CUDAToolkit_ROOT)
  if(DEFINED ${var} AND NOT "${${var}}" STREQUAL "")
    list(APPEND configure -D${var}=${${var}})
  endif()
endforeach()
run("configuring the consumer" ${configure})
run("building the consumer" ${CMAKE_COMMAND} --build ${consumer_build})
find_program(consumer kiln_consumer PATHS ${consumer_build} ${consumer_build}/Release NO_DEFAULT_PATH)
if(NOT consumer)
  message(FATAL_ERROR "no kiln_consumer executable in ${consumer_build}")
endif()
run("kiln_consumer" ${consumer} ${cache})
string(STRIP "${run_output}" got)
if(NOT got STREQUAL "kiln_consumer: 37 records in 5 batches")
  message(FATAL_ERROR "kiln_consumer read the wrong records: '${got}'")
endif()
message(STATUS "${got}")
