# The fuzz smoke run as ctest tests, only where clang-14 is installed
# (tools/install-deps.sh installs it): fuzz_build builds the targets with
# tools/run-fuzz.sh into build-fuzz/ (alone, RUN_SERIAL, as it uses every
# core), then each target runs 10 s from its seed corpus.
find_program(SPILLFS_CLANGXX_14 clang++-14)
if(SPILLFS_CLANGXX_14)
  set(_fuzz_script ${PROJECT_SOURCE_DIR}/tools/run-fuzz.sh)
  add_test(NAME fuzz_build COMMAND ${_fuzz_script} --build-only)
  set_tests_properties(fuzz_build PROPERTIES FIXTURES_SETUP fuzz_targets RUN_SERIAL TRUE TIMEOUT 600 LABELS fuzz)
  foreach(target records_fuzzer coding_fuzzer inspector_control_fuzzer control_plane_fuzzer)
    add_test(NAME fuzz_${target} COMMAND ${_fuzz_script} --no-build -t 10 ${target})
    set_tests_properties(fuzz_${target} PROPERTIES FIXTURES_REQUIRED fuzz_targets TIMEOUT 120 LABELS fuzz)
  endforeach()
endif()
