# source scripts/gpu-node-env.sh  -- on the GPU node (Ubuntu 24.04, g++ 13, pip PyTorch 2.11):
# unpacks the Debian dependency bundle carried in .deps (made by scripts/gpu-bundle.sh with scripts/gpu-node/bundle.sh) and
# exports CMAKE_PREFIX_PATH (bundle + pip LibTorch), LD_LIBRARY_PATH and CUDACXX.
#
# It also mends one known incompatibility: Cap'n Proto 0.9.2's capnp/blob.h defines
# `operator==(const char*, Text::Builder)` as `a == b.asString()`, which g++ 13 in C++20 mode
# rejects (kj drops its const char* overloads when three-way comparison exists; fixed upstream in
# 0.10). Swapping the operands keeps the meaning and compiles everywhere.
source "$(dirname "${BASH_SOURCE[0]}")/../.deps/env.sh"
_blob="${STRATA_DEPS_PREFIX:-/tmp/strata-deps}/usr/include/capnp/blob.h"
if [ -f "$_blob" ]; then
  sed -i 's/{ return a == b.asString(); }/{ return b.asString() == a; }/; s/{ return a != b.asString(); }/{ return b.asString() != a; }/' "$_blob"
fi
unset _blob
