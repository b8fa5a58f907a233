#!/usr/bin/env bash
# Installs what spillfs builds and tests with, as root:
#  1. Debian 12's packages (apt-get; skipped when all are installed);
#  2. the Python environment .venv/ in the checkout (ignored by git): the packages
#     pinned in tools/requirements.txt (torch 2.x, numpy, pytest, transformers,
#     safetensors, torch_geometric) and the spillfs package from clients/python,
#     editable, the way a user installs it. pip runs again only when the
#     requirements or clients/python/pyproject.toml changed since the last run.
# Environment: PYTHON (default python3) makes the venv; SPILLFS_VENV (default
# .venv) places it. To use an environment of your own instead, install the
# package into it (`pip install ./clients/python`) and pass
# -DSPILLFS_PYTHON=/path/to/python to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  build-essential cmake pkg-config git
  libfuse3-dev fuse3 liburing-dev librocksdb-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  attr xfsprogs
  help2man dpkg-dev  # the man page and the .deb (cpack, dpkg-shlibdeps)
  python3 python3-venv  # the venv below (Debian's python3 needs python3-venv for it)
  clang-14 libclang-rt-14-dev  # the fuzz smoke run (tools/run-fuzz.sh, ctest label fuzz)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# FUSE needs its device node; containers sometimes lack it.
[ -e /dev/fuse ] || mknod -m 666 /dev/fuse c 10 229

venv="${SPILLFS_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "making the Python environment $venv ($("${PYTHON:-python3}" --version))"
  "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.spillfs-installed"
want="$(cat tools/requirements.txt clients/python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing tools/requirements.txt and clients/python (editable) into $venv"
  # A wheel pip finds in its find-links (PIP_FIND_LINKS) is taken over PyPI's.
  # pip's own output goes to a log, shown only when it fails.
  log="$venv/pip-install.log"
  if ! "$venv/bin/pip" install --disable-pip-version-check -r tools/requirements.txt >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-deps: pip could not install tools/requirements.txt into $venv (log above)" >&2
    exit 1
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
    -e clients/python
  "$venv/bin/python" -c 'import torch, spillfs; print("python:", torch.__version__, spillfs.__file__)'
  echo "$want" >"$stamp"
fi
