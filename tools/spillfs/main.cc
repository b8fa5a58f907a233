// spillfs: make, mount and inspect spillfs volumes.
#include "commands.h"

int main(int argc, char** argv) { return spillfs::cli::Main(argc, argv); }
