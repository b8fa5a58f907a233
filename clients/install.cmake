# What `cmake --install` puts where for users of the client library:
#   LIBDIR/libspillfs_client.so, INCLUDEDIR/spillfs/client.h,
#   LIBDIR/pkgconfig/spillfs_client.pc            (pkg-config --cflags --libs spillfs_client)
#   LIBDIR/cmake/spillfs/                          (find_package(spillfs) -> spillfs::spillfs_client)
#   the Python package spillfs in the interpreter's site directory, with
#   spillfs/lib/libspillfs_client.so a relative symlink to the installed
#   library (spillfs/_native.py looks there), so it works under DESTDIR too.
include(CMakePackageConfigHelpers)

set_target_properties(spillfs_client PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
install(TARGETS spillfs_client EXPORT spillfsTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES include/spillfs/client.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/spillfs)

# The .pc file finds the prefix from where it lies, so it holds under DESTDIR and cpack.
file(RELATIVE_PATH pc_to_prefix /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(packaging/spillfs_client.pc.in ${CMAKE_CURRENT_BINARY_DIR}/spillfs_client.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/spillfs_client.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

install(EXPORT spillfsTargets NAMESPACE spillfs:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spillfs)
configure_package_config_file(packaging/spillfsConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/spillfsConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spillfs)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/spillfsConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/spillfsConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/spillfsConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/spillfs)

# The Python package. Its directory is decided at install time, from the
# prefix then in force (cpack installs under /usr whatever was configured):
# Debian's python3 reads /usr/lib/python3/dist-packages under /usr and
# PREFIX/lib/python3.X/dist-packages under any other prefix (/usr/local ...).
# SPILLFS_PYTHON_DIR (relative to the prefix) overrides both.
find_package(Python3 COMPONENTS Interpreter)
set(SPILLFS_PYTHON_DIR "" CACHE STRING "Where the Python package goes, relative to the prefix (default: see clients/install.cmake)")
if(Python3_FOUND)
  set(python_versioned_dir lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages)
else()
  set(python_versioned_dir lib/python3/dist-packages)
endif()
install(CODE "
  set(python_dir \"${SPILLFS_PYTHON_DIR}\")
  if(NOT python_dir)
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
      set(python_dir lib/python3/dist-packages)
    else()
      set(python_dir ${python_versioned_dir})
    endif()
  endif()
  set(package \"\${CMAKE_INSTALL_PREFIX}/\${python_dir}/spillfs\")
  file(INSTALL DESTINATION \"\${package}/..\" TYPE DIRECTORY FILES \"${CMAKE_CURRENT_SOURCE_DIR}/python/spillfs\"
       PATTERN __pycache__ EXCLUDE PATTERN lib EXCLUDE)
  file(RELATIVE_PATH library \"\${package}/lib\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/libspillfs_client.so\")
  file(MAKE_DIRECTORY \"\$ENV{DESTDIR}\${package}/lib\")
  message(STATUS \"Installing: \${package}/lib/libspillfs_client.so -> \${library}\")
  file(CREATE_LINK \"\${library}\" \"\$ENV{DESTDIR}\${package}/lib/libspillfs_client.so\" SYMBOLIC)")
