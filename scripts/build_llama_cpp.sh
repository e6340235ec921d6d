#!/usr/bin/env bash
# Builds llama.cpp, the baseline of `zerolayer bench llamacpp`, from the same sources as the
# pinned llama-cpp-python (its sdist's vendor/llama.cpp), for one instruction set, and installs
# its shared libraries and the tools the benchmark runs where the benchmark looks for them:
#
#   PREFIX/lib/libllama.so, libggml*.so   the library llama-cpp-python loads (LLAMA_CPP_LIB_PATH)
#   PREFIX/bin/llama-server               the online-serving baseline
#   PREFIX/bin/llama-quantize             llama.cpp's own quantizer (Q4_K_M, Q8_0 files)
#   PREFIX/bin/llama-perplexity, llama-bench
#
# Usage: scripts/build_llama_cpp.sh [ISA] [PREFIX]
#   ISA      native (default): GGML_NATIVE, whatever this CPU has (AVX-512 where it has it);
#            avx2: AVX2 + FMA + F16C only (no AVX-512, no AVX-VNNI), the build an AVX2-only
#            desktop runs, to compare with zerolayer under ZEROLAYER_CPU_ISA=avx2 on any host
#   PREFIX   install directory (default ${XDG_CACHE_HOME:-~/.cache}/zerolayer/llama.cpp-ISA)
# Environment:
#   LLAMA_CPP_SRC  an already unpacked llama.cpp source tree (skips the download)
#   PYTHON         the Python whose pip downloads the sdist (default: .venv/bin/python, python3)
#   JOBS           parallel compile jobs (default: nproc)
# Needs cmake and a C++17 compiler; nothing else (no OpenSSL, no web UI). About 8 minutes on 2
# cores. llama-cpp-python itself can then be installed without compiling llama.cpp again:
#   CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" .venv/bin/pip install llama-cpp-python==0.3.36
# and pointed at PREFIX/lib with LLAMA_CPP_LIB_PATH (the benchmark does so for --llama-cpp PREFIX).
set -euo pipefail

VERSION=0.3.36 # llama-cpp-python, as pinned in pyproject.toml's bench extra
ISA=${1:-native}
case $ISA in
  native) isa_flags=(-DGGML_NATIVE=ON) ;;
  avx2)
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
      -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
      -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF)
    ;;
  *) echo "usage: $0 [native|avx2] [PREFIX]" >&2; exit 2 ;;
esac
PREFIX=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/zerolayer/llama.cpp-$ISA}
JOBS=${JOBS:-$(nproc)}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=${LLAMA_CPP_SRC:-}
if [[ -z $src ]]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
  tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
  src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
fi

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
tools=(llama-server llama-quantize llama-perplexity llama-bench)
cmake --build "$work/build" --target llama "${tools[@]}" -j "$JOBS"
mkdir -p "$PREFIX/bin" "$PREFIX/lib"
for tool in "${tools[@]}"; do
  install -m 0755 "$work/build/bin/$tool" "$PREFIX/bin/$tool"
done
# The libraries with their version links (the tools and libllama name them by soname).
cp -P "$work/build/bin/"lib*.so* "$PREFIX/lib/"
if ldd "$PREFIX/bin/llama-server" | grep -q "not found"; then
  echo "$PREFIX/bin/llama-server: unresolved libraries:" >&2
  ldd "$PREFIX/bin/llama-server" | grep "not found" >&2
  exit 1
fi
echo "$PREFIX"
