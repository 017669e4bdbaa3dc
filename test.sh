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
modules=(bunlock sqlxlock otellock internal/adaptertest examples/thirdparty)

echo "--- go test ./... (root module)"
go test "$@" ./...
for m in "${modules[@]}"; do
  echo "--- go test ./... ($m)"
  (cd "$m" && go test -mod=mod "$@" ./...)
done
