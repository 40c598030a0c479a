#!/usr/bin/env bash
# Builds the SEV-SNP firmware a GELO CVM boots: OVMF's AmdSevX64 platform, the one whose
# SEV metadata has an SNP_KERNEL_HASHES page, so that the launch measurement covers the
# kernel, initrd and command line QEMU passes (direct boot, -kernel/-initrd/-append).
# Debian's `ovmf` package ships only OvmfPkgX64 builds, without that page (sev-snp-measure:
# "OVMF metadata doesn't include SNP_KERNEL_HASHES section"), so this builds the platform
# from Debian's own edk2 source package, same version as its `ovmf`.
#
#   scripts/release/ovmf.sh            -> prints the path of OVMF.amdsev.fd
#
# Cached under ${GELO_CACHE:-~/.cache/gelo}/release-tools/edk2-$VERSION/. Needs nasm and
# iasl (apt: nasm acpica-tools), gcc, uuid-dev, python3. The AmdSev platform embeds a GRUB
# image for its encrypted-boot fallback; we boot directly from the measured kernel and build
# without it (an empty grub.efi): say so wherever the firmware's digest is shown.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${EDK2_VERSION:-2025.02-8+deb13u1}"
suite="${EDK2_SUITE:-trixie}"
tools="${GELO_CACHE:-$HOME/.cache/gelo}/release-tools"
src="$tools/edk2-$version"
fd="$src/Build/AmdSev/RELEASE_GCC5/FV/OVMF.fd"
if [ -s "$fd" ]; then echo "$fd"; exit 0; fi

mkdir -p "$tools/apt/lists/partial" "$tools/apt/cache/archives/partial" "$tools/src"
# A private apt configuration: Debian's source for one package, without touching the
# machine's own sources.
printf 'deb-src http://deb.debian.org/debian %s main\n' "$suite" >"$tools/apt/sources.list"
apto=(-o "Dir::Etc::SourceList=$tools/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o "Dir::State::Lists=$tools/apt/lists" -o "Dir::Cache=$tools/apt/cache" -o Debug::NoLocking=1)
command -v nasm >/dev/null && command -v iasl >/dev/null || apt-get install -y -q nasm acpica-tools >&2
if [ ! -d "$src" ]; then
  apt-get "${apto[@]}" update >&2
  # The .dsc is not always served beside the tarballs: fetch what comes, then check each
  # tarball against the SHA-256 the signed source index gives.
  (cd "$tools/src" && apt-get "${apto[@]}" source --download-only "edk2=$version" >&2) || true
  apt-cache "${apto[@]}" showsrc edk2 \
    | awk '/^Checksums-Sha256:/{on=1;next} /^[^ ]/{on=0} on && /tar/{print $1"  "$3}' | sort -u >"$tools/src/SHA256SUMS"
  (cd "$tools/src" && sha256sum -c SHA256SUMS >&2)
  rm -rf "$src.tmp" && mkdir -p "$src.tmp"
  tar -xJf "$tools/src/edk2_${version%%-*}.orig.tar.xz" -C "$src.tmp" --strip-components=1
  tar -xJf "$tools/src/edk2_${version}.debian.tar.xz" -C "$src.tmp"
  # Debian's patches, in its order (what dpkg-source -x would apply).
  while read -r patch _; do
    case "$patch" in ''|'#'*) continue ;; esac
    patch -s -d "$src.tmp" -p1 <"$src.tmp/debian/patches/$patch"
  done <"$src.tmp/debian/patches/series"
  mv "$src.tmp" "$src"
fi
cd "$src"
# No GRUB: see the header.
sed -i 's|^\(\s*PREBUILD\s*=.*grub.sh.*\)$|#\1|' OvmfPkg/AmdSev/AmdSevX64.dsc
: >OvmfPkg/AmdSev/Grub/grub.efi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1735689600}"
nice -n 19 make -s -C BaseTools -j2 >&2
set +u
# shellcheck disable=SC1091
. ./edksetup.sh >&2
set -u
nice -n 19 build -q -n 2 -a X64 -t GCC5 -b RELEASE -p OvmfPkg/AmdSev/AmdSevX64.dsc >&2
echo "$fd"
