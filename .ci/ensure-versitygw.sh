#!/usr/bin/env bash
# Builds the S3-compatible test server (versitygw, Apache-2.0) the tests
# start through internal/testkit/s3test, once, into the user cache directory, where
# s3test.Binary finds it: ${XDG_CACHE_HOME:-$HOME/.cache}/forgeyard/s3test/<version>/.
# The version is s3test.Version. Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^const Version = "\(v[^"]*\)"$/\1/p' internal/testkit/s3test/s3test.go)
[ -n "$version" ] || { echo "ensure-versitygw: no Version in internal/testkit/s3test/s3test.go" >&2; exit 1; }
bin="${XDG_CACHE_HOME:-$HOME/.cache}/forgeyard/s3test/$version"
[ -x "$bin/versitygw" ] && exit 0
echo "building versitygw $version into $bin"
mkdir -p "$bin"
(cd "$bin" && GOBIN="$bin" GOFLAGS=-buildvcs=false GOWORK=off go install "github.com/versity/versitygw/cmd/versitygw@$version")
