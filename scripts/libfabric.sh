#!/usr/bin/env bash
# libfabric for Braid's provider tests and benchmarks (ffi/fabric, crate braid-fi).
#
#   scripts/libfabric.sh deps   installs what is missing with apt-get (as root): libfabric-dev
#                               (the provider headers the committed bindings came from) and
#                               libfabric-bin (fi_info, fi_pingpong), plus gcc for the C tests
#   scripts/libfabric.sh path   prints the folder to put in FI_PROVIDER_PATH after
#                               `cargo build --release -p braid-fi`
set -Eeuo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  deps)
    missing=()
    [[ -e /usr/include/rdma/providers/fi_prov.h ]] || missing+=(libfabric-dev)
    command -v fi_pingpong >/dev/null && command -v fi_info >/dev/null || missing+=(libfabric-bin)
    command -v gcc >/dev/null || missing+=(gcc)
    if ((${#missing[@]})); then
      echo "libfabric.sh: installing ${missing[*]}" >&2
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    ;;
  path)
    dir="${CARGO_TARGET_DIR:-target}/release/fi-provider"
    mkdir -p "$dir"
    cp "${CARGO_TARGET_DIR:-target}/release/libbraid_fi.so" "$dir/"
    realpath "$dir"
    ;;
  *)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
