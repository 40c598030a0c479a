# Shared by scripts/bench/*.sh (sourced).

# The directory of a llama-cpp-python 0.3.36 built for this CPU (GGML_NATIVE compiles for
# the machine it runs on), cached in ${GELO_CACHE:-~/.cache/gelo}/peers/llama-<cpu flags
# hash>. LLAMA_CPP_SDIST: a source archive (or wheel) to install where PyPI is out of reach.
llama_env() {
  # LLAMA_CPP_DIR: a llama-cpp-python installed elsewhere (pip --target), used as it is, for
  # hosts whose toolchain builds one that crashes (seen: gcc 13.3's libllama segfaulting in
  # model load while the same sources built by gcc 12 run there).
  if [ -n "${LLAMA_CPP_DIR:-}" ]; then echo "$LLAMA_CPP_DIR"; return; fi
  local cache="${GELO_CACHE:-$HOME/.cache/gelo}/peers"
  local sig; sig="$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
  local dir="$cache/llama-$sig"
  if [ ! -f "$dir/.done" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    local src="${LLAMA_CPP_SDIST:-llama-cpp-python==0.3.36}"
    echo "building llama-cpp-python 0.3.36 for this CPU into $dir" >&2
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      python3 -m pip install --quiet --no-deps --no-build-isolation --target "$dir" "$src" >&2
    PYTHONPATH="$dir" python3 -c "import diskcache" 2>/dev/null ||
      python3 -m pip install --quiet --no-deps --target "$dir" "${DISKCACHE_WHEEL:-diskcache==5.6.3}" >&2
    touch "$dir/.done"
  fi
  echo "$dir"
}
