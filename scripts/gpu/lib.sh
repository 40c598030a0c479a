# Sourced by the device-run scripts in this folder (from the repository root): the output
# folder, the Vulkan loader carried in .gl/ where the machine has none, and `stage`.
out="${OUT:-gpu-out}"
mkdir -p "$out"
if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 RUST_LOG="${RUST_LOG:-warn}"

# stage NAME SECONDS COMMAND...: runs COMMAND under a timeout; its output goes to
# $out/NAME.md, its stderr and the timing to $out/log.txt.
stage() {
  local name=$1 secs=$2
  shift 2
  echo "=== $name" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>>"$out/log.txt" | tee "$out/$name.md"
  echo "=== $name rc=${PIPESTATUS[0]} $((SECONDS - t0))s" | tee -a "$out/log.txt"
}
