#!/usr/bin/env bash
# Runs `go test ./...` in the root module and in every nested module: a
# root `go test ./...` does not enter directories that have a go.mod of
# their own. Arguments go to every `go test` (./test.sh -race -count=1).
#
# The nested modules require the root one through `replace ... => ../`, so
# they test the working tree, not a release. -mod=mod lets go update their
# go.mod/go.sum when the root module's requirements have moved; commit what
# changes (or run `go mod tidy` in the module).
set -euo pipefail

cd "$(dirname "$0")"

# Every nested module, in the order they run. .ci/run names the same list.
modules=(bunlock sqlxlock otellock cronlock gocronlock k8slock internal/adaptertest examples/thirdparty)

# CI narrows the run (it runs the chaos suite and examples/thirdparty in
# steps of their own): SQLEASE_TEST_PACKAGES replaces the root's ./...,
# SQLEASE_TEST_MODULES the list above (space-separated).
# SQLEASE_TEST_JOBS=N tests N nested modules at a time (default 1); then
# each module's output is printed whole, in the order of the list, once
# all have ended.
root_packages=${SQLEASE_TEST_PACKAGES:-./...}
if [ -n "${SQLEASE_TEST_MODULES+x}" ]; then
  read -r -a modules <<<"$SQLEASE_TEST_MODULES"
fi
jobs=${SQLEASE_TEST_JOBS:-1}

echo "--- go test (root module)"
# shellcheck disable=SC2086 # a list of packages
go test "$@" $root_packages
if ((jobs == 1)); then
  for m in "${modules[@]}"; do
    echo "--- go test ./... ($m)"
    (cd "$m" && go test -mod=mod "$@" ./...)
  done
  exit 0
fi

# test_module N M ARGS...: go test ./... in module M, its output in
# $logs/N.log (N: M's place in the list) and its exit status last.
test_module() {
  local n=$1 m=$2 start=$SECONDS
  shift 2
  {
    echo "--- go test ./... ($m)"
    local rc=0
    (cd "$m" && go test -mod=mod "$@" ./...) 2>&1 || rc=$?
    echo "($m: exit $rc after $((SECONDS - start))s)"
    return $rc
  } >"$logs/$n.log"
}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
running=0
for i in "${!modules[@]}"; do
  if ((running == jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  test_module "$i" "${modules[$i]}" "$@" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
for i in "${!modules[@]}"; do
  cat "$logs/$i.log"
done
exit $failed
