# The Debian package: `cpack --config build/CPackConfig.cmake -G DEB` (run
# from the build directory) writes spillfs_VERSION_ARCH.deb with what
# `cmake --install` installs, under /usr. Its library dependencies are
# computed by dpkg-shlibdeps (dpkg-dev); fuse3 gives fusermount3 and /dev/fuse.
# cpack (and `make install`) install what is built; they do not first build
# every target (the tests included), which is what CI has done already.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(CPACK_PACKAGE_NAME spillfs)
set(CPACK_PACKAGE_VENDOR spillfs)
set(CPACK_PACKAGE_CONTACT "spillfs maintainers <spillfs@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "filesystem that spills activations and GNN feature tables to SSD")
set(CPACK_PACKAGE_DESCRIPTION "spillfs is a FUSE filesystem over a RocksDB-indexed extent store driven with \
io_uring. It gives the activations and feature tables of training jobs a home on SSD through ordinary file \
paths, with a client library (C ABI, Python) for the direct data path.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "fuse3")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3, python3-numpy, python3-torch")
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
include(CPack)
