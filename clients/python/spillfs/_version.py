"""The version of the spillfs Python package: that of the CMake project (CMakeLists.txt),
which libspillfs_client.so's spill_version() reports."""

__version__ = "0.1.0"
