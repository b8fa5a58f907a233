# The libFuzzer build (tests/fuzz): included by the top CMakeLists.txt before
# the libraries, so that with SPILLFS_FUZZ=ON every spillfs source is built
# with coverage instrumentation, AddressSanitizer and UndefinedBehaviorSanitizer
# (UB is fatal, so libFuzzer keeps the input). Needs clang (clang++-14 on
# Debian 12 with libclang-rt-14-dev); tools/run-fuzz.sh configures it.
option(SPILLFS_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)
if(SPILLFS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SPILLFS_FUZZ needs clang: configure with -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
  # The targets (they name the libraries, which are defined later: fine).
  add_subdirectory(${CMAKE_CURRENT_LIST_DIR} ${CMAKE_BINARY_DIR}/fuzz)
endif()
