#!/usr/bin/env bash
# Builds llama.cpp's llama-server, the online-serving baseline of `zerolayer bench llamacpp`, from
# the same llama.cpp sources as the pinned llama-cpp-python (its sdist's vendor/llama.cpp), for
# this machine's CPU (GGML_NATIVE), and installs it where the benchmark looks for it.
#
# Usage: scripts/build_llama_server.sh [PREFIX]
#   PREFIX   install directory (default ${XDG_CACHE_HOME:-~/.cache}/zerolayer/llama-server); the
#            binary goes to PREFIX/bin/llama-server, which is printed at the end.
# Environment:
#   LLAMA_CPP_SRC  an already unpacked llama.cpp source tree (skips the download)
#   PYTHON         the Python whose pip downloads the sdist (default: .venv/bin/python, python3)
#   JOBS           parallel compile jobs (default: nproc)
# Needs cmake and a C++17 compiler; nothing else (no OpenSSL, no web UI).
set -euo pipefail

VERSION=0.3.36 # llama-cpp-python, as pinned in pyproject.toml's bench extra
PREFIX=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/zerolayer/llama-server}
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

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
cmake --build "$work/build" --target llama-server -j "$JOBS"
install -D -m 0755 "$work/build/bin/llama-server" "$PREFIX/bin/llama-server"
echo "$PREFIX/bin/llama-server"
