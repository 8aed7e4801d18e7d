# pdq_test(NAME foo_test SRCS a.cc b.cc DEPS pdq::engine [LABELS gpu])
# adds a GoogleTest executable and registers its tests with ctest.
include(GoogleTest)
function(pdq_test)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(labels cpu)
  if(T_LABELS)
    set(labels ${T_LABELS})
  endif()
  # A test that calls GTEST_SKIP exits 0, so ctest would count it as passed;
  # matching gtest's skip marker makes ctest report it as "Skipped" and list it
  # under "The following tests did not run" (the run still succeeds). Recent
  # CMake (3.25 on Debian 12) sets the same default in gtest_discover_tests;
  # stating it here keeps it whatever CMake's module does.
  gtest_discover_tests(${T_NAME}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS "${labels}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    DISCOVERY_TIMEOUT 60)
endfunction()
