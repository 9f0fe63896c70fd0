#!/usr/bin/env bash
# Builds the QEMU guest image in which Braid's tests meet real kernel verbs (Soft-RoCE, rxe):
# Debian's own kernel and an initramfs with busybox, the rdma_rxe and veth modules, rdma-core
# (libibverbs, the rxe provider, ibverbs-utils, perftest) and iproute2's `ip` and `rdma`, all
# taken from Debian packages (`apt-get download` + `dpkg-deb -x`). The host kernel has no
# RDMA subsystem; the guest's /init (scripts/guest/init) loads the modules, joins two rxe
# devices over one veth pair and runs the command scripts/guest/run.sh hands it.
#
# Everything lands in a cache directory (BRAID_GUEST_DIR, default target/guest):
#   debs/      the downloaded packages (downloaded once; delete to refresh)
#   image/     vmlinuz, base.cpio.gz and a stamp of the inputs; rebuilt only when the package
#              versions, this script, init or the module list change
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/guest/build-image.sh [COMMAND]

  (none)   builds the image if its inputs changed, prints the image directory
  deps     installs what the build and run need with apt-get when missing: qemu-system-x86
           (qemu-system-x86_64), kmod (depmod, modprobe), cpio; needs root
  clean    deletes the image (keeps the downloaded packages)

Environment: BRAID_GUEST_DIR (cache directory, default <repo>/target/guest).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${BRAID_GUEST_DIR:-$repo/target/guest}
debs=$cache/debs
image=$cache/image

die() { echo "build-image.sh: $*" >&2; exit 1; }
log() { echo "build-image.sh: $*" >&2; }

# Packages put into the guest (the kernel package is resolved from linux-image-amd64). The
# host's own libc and the libraries `ldd` finds on the host (Debian 12 as well) fill in the
# rest of the shared-library closure.
PACKAGES=(busybox-static libibverbs1 ibverbs-providers ibverbs-utils perftest librdmacm1
  libnl-3-200 libnl-route-3-200 libpci3 libibumad3 iproute2)
# Modules insmod-ed at boot, each with its dependencies (modprobe --show-depends) ahead of it.
# crc32_generic is loaded by hand: rdma_rxe asks the crypto API for "crc32" at run time,
# which nothing can autoload without a modprobe in the guest.
MODULES=(crc32_generic rdma_rxe ib_uverbs rdma_ucm veth)

deps() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  command -v depmod >/dev/null && command -v modprobe >/dev/null || missing+=(kmod)
  command -v cpio >/dev/null || missing+=(cpio)
  command -v dpkg-deb >/dev/null || missing+=(dpkg)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

# The kernel package linux-image-amd64 points at, e.g. linux-image-6.1.0-57-amd64.
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# The versions apt would download, looked up once (apt-cache takes seconds on a loaded
# machine): resolve PKG... fills CANDIDATE[pkg].
declare -A CANDIDATE=()
resolve() {
  local pkg="" a b
  while read -r a b; do
    case $a in
    *:) [[ $a == Candidate: ]] && [[ -n $pkg ]] && CANDIDATE[$pkg]=$b || pkg=${a%:} ;;
    esac
  done < <(apt-cache policy "$@" 2>/dev/null | grep -E '^[^ ]|^  Candidate:')
}

# candidate PKG: the version apt would download ("" when apt knows none).
candidate() {
  echo "${CANDIDATE[$1]:-}"
}

# Downloads every package not in debs/ yet (an apt-get update first when apt knows none).
download() {
  local pkgs=("$@") want=() p v f
  mkdir -p "$debs"
  for p in "${pkgs[@]}"; do
    v=$(candidate "$p")
    if [[ -z $v || $v == "(none)" ]]; then
      want+=("$p")
      continue
    fi
    f=$(printf '%s_%s_amd64.deb' "$p" "${v//:/%3a}")
    [[ -f $debs/$f ]] || want+=("$p")
  done
  ((${#want[@]})) || return 0
  if [[ -z $(candidate busybox-static) || $(candidate busybox-static) == "(none)" ]]; then
    log "apt knows no packages yet: apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    resolve "${pkgs[@]}"
  fi
  log "downloading ${want[*]}"
  (cd "$debs" && apt-get download -qq "${want[@]}" 2>&1 | grep -v 'unsandboxed as root' >&2 || true)
  for p in "${want[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || die "apt-get download $p failed"
  done
}

# deb_of PKG: the cached .deb of the candidate version of PKG.
deb_of() {
  local v
  v=$(candidate "$1")
  local f
  f=$debs/$(printf '%s_%s_amd64.deb' "$1" "${v//:/%3a}")
  [[ -f $f ]] || die "no package file for $1 ($f)"
  echo "$f"
}

# copy_libs ROOT FILE...: copies into ROOT the shared libraries `ldd` lists for each FILE
# (looked up in ROOT's library folders first, then on the host), under the name ldd lists, in
# ROOT/usr/lib/x86_64-linux-gnu; the program interpreter goes to ROOT/usr/lib64.
copy_libs() {
  local root=$1
  shift
  local libpath=$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/libibverbs
  local f line name path out
  for f in "$@"; do
    # Not every file is a dynamic ELF (static busybox): ldd says so and fails.
    out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>/dev/null) || continue
    while read -r line; do
      case $line in
      *"=> not found"*) die "$f needs ${line%% *}, which neither the packages nor the host have" ;;
      *" => /"*)
        name=${line%% =>*}
        path=${line#*=> }
        path=${path%% (*}
        ;;
      /*)
        path=${line%% (*}
        name=$(basename "$path")
        if [[ $name == ld-linux* ]]; then
          [[ -e $root/usr/lib64/$name ]] || cp -L "$path" "$root/usr/lib64/$name"
          continue
        fi
        ;;
      *) continue ;;
      esac
      [[ $path == "$root"/* ]] && continue
      [[ -e $root/usr/lib/x86_64-linux-gnu/$name ]] || cp -L "$path" "$root/usr/lib/x86_64-linux-gnu/$name"
    done <<<"$out"
  done
}

build() {
  local kpkg
  kpkg=$(kernel_package)
  if [[ -z $kpkg ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    kpkg=$(kernel_package)
  fi
  [[ -n $kpkg ]] || die "cannot resolve linux-image-amd64 to a kernel package"
  resolve "$kpkg" "${PACKAGES[@]}"
  download "$kpkg" "${PACKAGES[@]}"

  # The stamp: package versions, this script, init and the module list.
  local stamp
  stamp=$(
    {
      for p in "$kpkg" "${PACKAGES[@]}"; do basename "$(deb_of "$p")"; done
      echo "${MODULES[*]}"
      cat "$here/build-image.sh" "$here/init"
    } | sha256sum | cut -c1-16
  )
  if [[ -f $image/stamp && $(cat "$image/stamp") == "$stamp" && -f $image/vmlinuz && -f $image/base.cpio.gz ]]; then
    echo "$image"
    return 0
  fi
  log "building the guest image ($kpkg) in $image"

  # The kernel package unpacked once per kernel version (400 MB, a minute to unpack): only
  # its kernel image and module tree are used, and only the modules /init loads go in.
  local work=$cache/work kdir=$cache/kernel/$kpkg
  rm -rf "$work" "$image"
  mkdir -p "$work/pkgs" "$image"
  if [[ ! -f $kdir/.unpacked ]]; then
    rm -rf "$cache/kernel"
    mkdir -p "$kdir"
    dpkg-deb -x "$(deb_of "$kpkg")" "$kdir"
    depmod -b "$kdir" "$(basename "$(ls -d "$kdir/lib/modules/"*)")"
    touch "$kdir/.unpacked"
  fi
  for p in "${PACKAGES[@]}"; do dpkg-deb -x "$(deb_of "$p")" "$work/pkgs"; done

  local kver
  kver=$(basename "$(ls -d "$kdir/lib/modules/"*)")
  cp "$kdir/boot/vmlinuz-$kver" "$image/vmlinuz"

  # The guest's root: a merged /usr like Debian 12 (bin, sbin, lib, lib64 link into usr/).
  local root=$work/root
  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,guest,root}
  ln -s usr/bin "$root/bin"
  ln -s usr/sbin "$root/sbin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  local d
  for d in bin sbin lib; do
    [[ -d $work/pkgs/$d ]] && cp -a "$work/pkgs/$d/." "$root/usr/$d/"
  done
  for d in bin sbin lib; do
    [[ -d $work/pkgs/usr/$d ]] && cp -a "$work/pkgs/usr/$d/." "$root/usr/$d/"
  done
  cp -a "$work/pkgs/etc/." "$root/etc/"

  # Modules, in insmod order, deduplicated; the list /init reads.
  local m mod
  local -A seen=()
  : >"$root/etc/guest-modules"
  for m in "${MODULES[@]}"; do
    while read -r _ mod _; do
      [[ -n ${seen[$mod]:-} ]] && continue
      seen[$mod]=1
      local rel=${mod#"$kdir"}
      mkdir -p "$root/usr$(dirname "${rel#/usr}")"
      cp "$mod" "$root/usr${rel#/usr}"
      echo "/usr${rel#/usr}" >>"$root/etc/guest-modules"
    done < <(modprobe -d "$kdir" -S "$kver" --show-depends "$m" | grep '^insmod ')
  done
  [[ -s $root/etc/guest-modules ]] || die "no modules resolved"

  # Shared libraries of every dynamic ELF put in, rdma-core's providers included (libibverbs
  # dlopens them, so no ldd of a program lists them).
  local elves=()
  while IFS= read -r -d '' f; do
    if [[ $(head -c4 "$f" | od -An -c | tr -d ' ') == '177ELF' ]]; then elves+=("$f"); fi
  done < <(find "$root/usr" -type f -print0)
  copy_libs "$root" "${elves[@]}"

  # /bin/sh for scripts (run.sh's /guest/cmd) and programs that spawn a shell.
  ln -s busybox "$root/usr/bin/sh"
  cp "$here/init" "$root/init"
  chmod 755 "$root/init"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\n' >"$root/etc/group"
  # An initial console for /init's first writes (the kernel opens /dev/console before init
  # mounts devtmpfs); without root, /init redirects to it once devtmpfs is mounted.
  if [[ $(id -u) -eq 0 ]]; then mknod -m 600 "$root/dev/console" c 5 1; fi

  (cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) | gzip -6 >"$image/base.cpio.gz"
  # Zero padding to a 512-byte boundary: run.sh appends an uncompressed cpio archive, whose
  # headers the kernel only finds 4-byte aligned (it skips zeros between archives).
  truncate -s %512 "$image/base.cpio.gz"
  echo "$kver" >"$image/kernel-version"
  echo "$stamp" >"$image/stamp"
  rm -rf "$work"
  log "image ready: $(du -h "$image/base.cpio.gz" | cut -f1) initramfs, kernel $kver"
  echo "$image"
}

case ${1:-} in
"") build ;;
deps) deps ;;
libs) # libs ROOT FILE...: copy_libs, for run.sh's per-run overlay
  shift
  root=$1
  shift
  mkdir -p "$root/usr/lib/x86_64-linux-gnu" "$root/usr/lib64"
  copy_libs "$root" "$@"
  ;;
clean) rm -rf "$image" ;;
-h | --help | help) usage ;;
*)
  usage >&2
  exit 2
  ;;
esac
