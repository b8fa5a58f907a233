# CUDA for spillfs_cuda (cuda/), included from the top-level CMakeLists.txt
# after its compile options: the language is enabled at the top, since the
# client library links CUDA objects.
#
# SPILLFS_HAVE_CUDA is set where nvcc and the CUDA toolkit are found and
# SPILLFS_CUDA is ON; elsewhere cuda/ builds its host-only parts. Turn it off
# with -DSPILLFS_CUDA=OFF (or -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON).
# Architectures: CMAKE_CUDA_ARCHITECTURES, 90 (Hopper) unless set.
option(SPILLFS_CUDA "Build the CUDA parts of cuda/ where nvcc is found" ON)
set(SPILLFS_HAVE_CUDA OFF)
if(SPILLFS_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # C++20 as the host code. CMake 3.25 knows nvcc's flags up to C++17 only
    # (nvcc 12+ takes -std=c++20); set after enable_language, whose checks
    # need no dialect.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(SPILLFS_HAVE_CUDA ON)
    # The compile options set so far are the host compiler's (-Wall, the
    # sanitizers): nvcc refuses them, so they are kept from CUDA sources,
    # which get the warnings through -Xcompiler instead.
    get_directory_property(_spillfs_options COMPILE_OPTIONS)
    set(_spillfs_guarded)
    foreach(_option IN LISTS _spillfs_options)
      list(APPEND _spillfs_guarded "$<$<NOT:$<COMPILE_LANGUAGE:CUDA>>:${_option}>")
    endforeach()
    set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_spillfs_guarded}")
    add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>")
  endif()
endif()
message(STATUS "spillfs CUDA: ${SPILLFS_HAVE_CUDA} (architectures: ${CMAKE_CUDA_ARCHITECTURES})")
