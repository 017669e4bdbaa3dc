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
root_packages=${SQLEASE_TEST_PACKAGES:-./...}
if [ -n "${SQLEASE_TEST_MODULES+x}" ]; then
  read -r -a modules <<<"$SQLEASE_TEST_MODULES"
fi

echo "--- go test (root module)"
# shellcheck disable=SC2086 # a list of packages
go test "$@" $root_packages
for m in "${modules[@]}"; do
  echo "--- go test ./... ($m)"
  (cd "$m" && go test -mod=mod "$@" ./...)
done
