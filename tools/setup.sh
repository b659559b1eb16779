#!/usr/bin/env bash
# tools/setup.sh — install every Debian package mpengine needs to build and test, on a fresh
# Debian 12 machine. Idempotent: when everything is present it checks and returns in a second.
#
# CUDA is not a Debian package: when /usr/local/cuda exists the CUDA code is built with it,
# otherwise mpengine builds its CPU engine alone.
set -euo pipefail

packages=(
  bazel-bootstrap   # Bazel 4.2.3, builds offline with third_party/ stand-ins
  build-essential   # gcc, g++, make
  libcjson-dev      # JSON parsing of models, clusters, plans, manifests
  libopenblas-dev   # CPU GEMMs
  libopenmpi-dev    # one process per rank, CPU communicators
  openmpi-bin       # mpirun
  libgtest-dev      # GoogleTest suites
  libpcre2-dev      # tokenizers' split regexes (Unicode classes, look-ahead)
  libicu-dev        # tokenizers' Unicode normalizers (NFC, NFKC)
  iproute2 iptables # the test hosts of the many-hosts tests (tests/support/netns_cluster.sh)
  slurm-wlm munge    # a real Slurm on those test hosts (tests/support/netns_slurm.sh)
  fortunes fortunes-de fortunes-es fortunes-it fortunes-pl fortunes-ru fortunes-zh fortunes-cs
  fortunes-eo-iso3
                    # real multilingual text: the tokenizer goldens are compared on it
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
