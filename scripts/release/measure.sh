#!/usr/bin/env bash
# Derives the SEV-SNP launch measurement of a GELO CVM from its parts, with an existing
# calculator (sev-snp-measure, PyPI), instead of copying a number from a running guest.
#
#   scripts/release/measure.sh --binary PATH --out DIR [--vcpus N] [--cmdline TEXT]
#
# The parts (each one's SHA-256 goes into DIR/launch.json):
# - firmware: OVMF's AmdSevX64 platform built from Debian's edk2 source (scripts/release/ovmf.sh);
#   its SEV metadata carries the SNP_KERNEL_HASHES page, so the measurement covers the next
#   three parts, which QEMU passes by direct boot (-kernel/-initrd/-append);
# - kernel: Debian's signed-off linux-image for amd64 (SEV-SNP guest support built in,
#   /dev/sev-guest from the sev-guest module);
# - initrd: made here, byte for byte reproducible (scripts/release/initrd.py): the release
#   binary at /usr/bin/gelo and the kernel's sev-guest and tsm modules;
# - command line, vCPU count and type, VMM type and guest features: below.
# The firmware, kernel and tool versions are pinned here; change one and the measurement
# changes, which is the point.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary=""
out=""
VCPUS=2
CMDLINE="console=ttyS0 rdinit=/init panic=-1"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --vcpus) VCPUS="$2"; shift 2 ;;
    --cmdline) CMDLINE="$2"; shift 2 ;;
    *) echo "usage: $0 --binary PATH --out DIR [--vcpus N] [--cmdline TEXT]" >&2; exit 2 ;;
  esac
done
[ -f "$binary" ] && [ -n "$out" ] || { echo "usage: $0 --binary PATH --out DIR" >&2; exit 2; }
mkdir -p "$out"

KERNEL_PACKAGE="linux-image-6.12.117+deb13-amd64"
KERNEL_VERSION="6.12.117+deb13-amd64"
SUITE="trixie"
SEV_SNP_MEASURE="sev-snp-measure==0.0.13"
VCPU_TYPE="EPYC-Genoa"
VMM_TYPE="QEMU"
GUEST_FEATURES="0x1"

tools="${GELO_CACHE:-$HOME/.cache/gelo}/release-tools"
mkdir -p "$tools/debs" "$tools/parts" "$tools/apt/lists-bin/partial" "$tools/apt/cache/archives/partial"

# The calculator, in its own virtual environment (not the system's Python).
if ! "$tools/venv/bin/sev-snp-measure" --version >/dev/null 2>&1; then
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q "$SEV_SNP_MEASURE"
fi

# The firmware.
ovmf="$(bash "$here/ovmf.sh" | tail -1)"

# The kernel and its modules, from Debian through apt (which checks each package against
# the suite's signed index), with a private apt configuration.
printf 'deb http://deb.debian.org/debian %s main\n' "$SUITE" >"$tools/apt/sources.list.bin"
apto=(-o "Dir::Etc::SourceList=$tools/apt/sources.list.bin" -o Dir::Etc::SourceParts=/nonexistent
      -o "Dir::State::Lists=$tools/apt/lists-bin" -o "Dir::Cache=$tools/apt/cache" -o Debug::NoLocking=1)
kdir="$tools/parts/$KERNEL_PACKAGE"
if [ ! -s "$kdir/boot/vmlinuz-$KERNEL_VERSION" ]; then
  apt-get "${apto[@]}" update >&2
  (cd "$tools/debs" && apt-get "${apto[@]}" download "$KERNEL_PACKAGE" >&2)
  deb="$(ls "$tools/debs/${KERNEL_PACKAGE}"_*.deb | head -1)"
  mkdir -p "$kdir"
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$kdir" ./boot "./usr/lib/modules/$KERNEL_VERSION/kernel/drivers/virt/coco"
fi
kernel="$kdir/boot/vmlinuz-$KERNEL_VERSION"
coco="$kdir/usr/lib/modules/$KERNEL_VERSION/kernel/drivers/virt/coco"

# The initrd, with the commit's time as every file's time.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-0}"
python3 "$here/initrd.py" "$out/initrd.cpio" \
  "usr/bin/gelo=$binary" \
  "usr/lib/modules/$KERNEL_VERSION/kernel/drivers/virt/coco/sev-guest/sev-guest.ko.xz=$coco/sev-guest/sev-guest.ko.xz" \
  "usr/lib/modules/$KERNEL_VERSION/kernel/drivers/virt/coco/tsm.ko.xz=$coco/tsm.ko.xz"

measure=("$tools/venv/bin/sev-snp-measure" --mode snp --vcpus "$VCPUS" --vcpu-type "$VCPU_TYPE"
         --vmm-type "$VMM_TYPE" --guest-features "$GUEST_FEATURES" --ovmf "$ovmf" --kernel "$kernel"
         --initrd "$out/initrd.cpio" --append "$CMDLINE" --output-format hex)
measurement="$("${measure[@]}")"
sha() { sha256sum "$1" | cut -d' ' -f1; }
python3 - "$out/launch.json" <<PY
import json, sys
json.dump({
  "calculator": "$SEV_SNP_MEASURE",
  "command": "sev-snp-measure --mode snp --vcpus $VCPUS --vcpu-type $VCPU_TYPE --vmm-type $VMM_TYPE --guest-features $GUEST_FEATURES --ovmf OVMF.amdsev.fd --kernel vmlinuz --initrd initrd.cpio --append '$CMDLINE' --output-format hex",
  "firmware": {"what": "OVMF AmdSevX64, RELEASE, GCC5, built by scripts/release/ovmf.sh from Debian edk2 ${EDK2_VERSION:-2025.02-8+deb13u1} (no GRUB)", "sha256": "$(sha "$ovmf")"},
  "kernel": {"what": "Debian $KERNEL_PACKAGE ($SUITE)", "sha256": "$(sha "$kernel")"},
  "initrd": {"what": "scripts/release/initrd.py: /usr/bin/gelo, sev-guest.ko.xz, tsm.ko.xz", "sha256": "$(sha "$out/initrd.cpio")", "gelo_sha256": "$(sha "$binary")"},
  "cmdline": "$CMDLINE",
  "vcpus": $VCPUS,
  "vcpu_type": "$VCPU_TYPE",
  "vmm_type": "$VMM_TYPE",
  "guest_features": "$GUEST_FEATURES",
  "measurement": "$measurement",
}, open(sys.argv[1], "w"), indent=2)
open(sys.argv[1], "a").write("\n")
PY
echo "$measurement"
