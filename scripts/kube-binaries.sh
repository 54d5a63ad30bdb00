#!/usr/bin/env bash
# A real Kubernetes control plane's binaries for the tests, unpacked once into a cache folder.
#   scripts/kube-binaries.sh    prints the folder holding etcd, kube-apiserver,
#                               kube-controller-manager and kube-scheduler
# Export it the way envtest does, plus our variable for the controller manager and scheduler:
#   KUBEBUILDER_ASSETS=$(scripts/kube-binaries.sh); export KUBEBUILDER_ASSETS
#   export ZEROPILOT_KUBE_ASSETS=$KUBEBUILDER_ASSETS
# Sources: ../shared/tools/kubernetes/*.xz beside the repository (v1.36.2, sha256 pinned below;
# override with $ZEROPILOT_KUBE_SOURCE) and etcd from Debian's etcd-server, installed when
# missing (needs root). Cache folder: $ZEROPILOT_TOOLS_DIR, default ~/.cache/zeropilot/tools.
set -euo pipefail

KUBE_VERSION=1.36.2
REPO=$(cd "$(dirname "$0")/.." && pwd)
SOURCE=${ZEROPILOT_KUBE_SOURCE:-$REPO/../shared/tools/kubernetes}
TOOLS_DIR=${ZEROPILOT_TOOLS_DIR:-$HOME/.cache/zeropilot/tools}
TARGET=$TOOLS_DIR/kubernetes-$KUBE_VERSION
declare -A SHA256=(
  [kube-apiserver]=a9494252299a26307a317643e0aeb2a534385edbbef12afec745be4e5fca7242
  [kube-controller-manager]=db5237817bafe9859d9fd2dfbf64538118892392147bbfd6fe99fa945bb10155
  [kube-scheduler]=17c1d5222a26ad8d9ba50ee722ff09a85a502bef4fa07a34193690f5dd22ae28
)
WORK_DIR=""

cleanup() {
  if [[ -n $WORK_DIR ]]; then rm -rf "$WORK_DIR"; fi
}
trap cleanup EXIT

fail() {
  echo "kube-binaries.sh: $*" >&2
  exit 1
}

unpack() {
  local name=$1
  [[ -x $TARGET/$name ]] && return
  local packed=$SOURCE/$name.xz
  [[ -f $packed ]] || fail "$packed is missing (set ZEROPILOT_KUBE_SOURCE to the folder of the .xz files)"
  local actual
  actual=$(sha256sum "$packed" | cut -d' ' -f1)
  [[ $actual == "${SHA256[$name]}" ]] || fail "sha256 of $packed is $actual, expected ${SHA256[$name]}"
  # A private folder next to the target: the final mv is an atomic rename, so racing runs each
  # put a whole binary in place and a reader never sees half a file.
  WORK_DIR=$(mktemp -d "$TOOLS_DIR/.kube-$name.XXXXXX")
  xz -dc "$packed" >"$WORK_DIR/$name"
  chmod 0755 "$WORK_DIR/$name"
  "$WORK_DIR/$name" --version 2>&1 | grep -q "v$KUBE_VERSION" || fail "$name is not v$KUBE_VERSION"
  mv -f "$WORK_DIR/$name" "$TARGET/$name"
  rm -rf "$WORK_DIR"
  WORK_DIR=""
}

apt_install() {
  ((EUID == 0)) || fail "$1 is missing: apt-get install -y $2 (as root)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"; } >&2 ||
    fail "apt-get install $2 failed"
}

install_etcd() {
  command -v etcd >/dev/null || apt_install etcd etcd-server
  # envtest looks for etcd beside kube-apiserver in KUBEBUILDER_ASSETS.
  ln -sf "$(command -v etcd)" "$TARGET/etcd"
}

command -v xz >/dev/null || apt_install xz xz-utils
mkdir -p "$TARGET"
for name in "${!SHA256[@]}"; do unpack "$name"; done
install_etcd
echo "$TARGET"
