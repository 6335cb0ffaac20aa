# Runs a Catch2 test executable on the hidden cases of TEST_SPEC and checks
# its exit code and output: how a skip (kiln::testing::Skip) is reported.
#   cmake -DBIN=exe -DTEST_SPEC=spec -DMUST_RUN=0|1 -DEXPECT_CODE=n
#         -DEXPECT_TEXT=text -P skip_check.cmake
# MUST_RUN=1 runs it with KILN_TESTS_MUST_RUN=1, 0 without the variable.
if(MUST_RUN)
  set(env KILN_TESTS_MUST_RUN=1)
else()
  set(env --unset=KILN_TESTS_MUST_RUN)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} ${BIN} ${TEST_SPEC}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(FIND "${out}" "${EXPECT_TEXT}" at)
if(NOT code EQUAL EXPECT_CODE OR at EQUAL -1)
  message(FATAL_ERROR "${BIN} ${TEST_SPEC} (KILN_TESTS_MUST_RUN=${MUST_RUN}): exit ${code}, "
                      "expected ${EXPECT_CODE} and the text '${EXPECT_TEXT}'; output:\n${out}")
endif()
