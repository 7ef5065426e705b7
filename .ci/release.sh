#!/usr/bin/env bash
# make release: static linux/amd64 and linux/arm64 builds of forgeyard,
# forgeyard-daemon, forgeyard-agent and forgeyard-relay, packed with their
# man pages, shell completions, systemd units and docs into
#   out/release/forgeyard-transport_VERSION_linux_ARCH.tar.gz
# plus an OCI image layout tarball per server binary (both platforms)
#   out/release/forgeyard-{daemon,agent,relay}_VERSION_oci.tar
# and out/release/SHA256SUMS over all of them. Reproducible: file times are
# SOURCE_DATE_EPOCH (default: the last commit's time).
#
#   VERSION=v1.2.0 make release      # default: git describe --tags --always --dirty
#   RELEASE_ARCHES="amd64" make release
#   SOURCE_URL=https://… make release    # label org.opencontainers.image.source of the images
#
# goreleaser would do the same; it is not used because its module graph is
# far larger than this project's and a plain script is easier to audit.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${OUT:-out/release}
ARCHES=${RELEASE_ARCHES:-amd64 arm64}
BINARIES="forgeyard forgeyard-daemon forgeyard-agent forgeyard-relay"
IMAGES="forgeyard-daemon forgeyard-agent forgeyard-relay"

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo "")}
MODIFIED=false
if [ -n "$COMMIT" ] && ! git diff --quiet HEAD -- 2>/dev/null; then MODIFIED=true; fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
PKG=forgeyard.dev/transport/internal/buildinfo
LDFLAGS="-s -w -X $PKG.version=$VERSION -X $PKG.commit=$COMMIT -X $PKG.modified=$MODIFIED"

rm -rf "$OUT"
STAGE="$OUT/stage"
mkdir -p "$STAGE"
echo "release $VERSION (commit ${COMMIT:-unknown}, modified $MODIFIED, SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH) for: $ARCHES"

# Man pages and completions come from the command trees; they are the same
# for every platform, so the host's build writes them.
host="$STAGE/host"
mkdir -p "$host/bin" "$STAGE/share/man/man1" "$STAGE/share/completions"
for b in $BINARIES; do
  CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$host/bin/$b" "./cmd/$b"
  "$host/bin/$b" man > "$STAGE/share/man/man1/$b.1"
done
"$host/bin/forgeyard" completion bash > "$STAGE/share/completions/forgeyard.bash"
"$host/bin/forgeyard" completion zsh > "$STAGE/share/completions/_forgeyard"
"$host/bin/forgeyard" completion fish > "$STAGE/share/completions/forgeyard.fish"
"$host/bin/forgeyard" --version

for arch in $ARCHES; do
  name="forgeyard-transport_${VERSION}_linux_${arch}"
  dir="$STAGE/$name"
  mkdir -p "$dir/bin" "$dir/share" "$dir/systemd" "$dir/docs"
  for b in $BINARIES; do
    CGO_ENABLED=0 GOOS=linux GOARCH=$arch "$GO" build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$dir/bin/$b" "./cmd/$b"
    # Static: no program interpreter, no dynamic section.
    if readelf -lW "$dir/bin/$b" 2>/dev/null | grep -q 'Requesting program interpreter'; then
      echo "$b ($arch) is not static" >&2
      exit 1
    fi
  done
  cp -r "$STAGE/share/man" "$STAGE/share/completions" "$dir/share/"
  cp packaging/systemd/* "$dir/systemd/"
  cp README.md "$dir/"
  cp docs/operations.md "$dir/docs/"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$STAGE" -cf - "$name" | gzip -n -9 > "$OUT/$name.tar.gz"
  echo "$OUT/$name.tar.gz"
done

for img in $IMAGES; do
  bins=()
  for arch in $ARCHES; do
    bins+=(--binary "linux/$arch=$STAGE/forgeyard-transport_${VERSION}_linux_${arch}/bin/$img")
  done
  ca=/etc/ssl/certs/ca-certificates.crt
  [ -f "$ca" ] || ca=""
  "$GO" run ./internal/tools/mkimage --name "$img" "${bins[@]}" --version "$VERSION" --revision "$COMMIT" --source "${SOURCE_URL:-}" \
    --ca-certificates "$ca" --out "$OUT/${img}_${VERSION}_oci.tar"
done

rm -rf "$STAGE"
(cd "$OUT" && sha256sum -- *.tar.gz *.tar > SHA256SUMS)
echo "$OUT/SHA256SUMS:"
cat "$OUT/SHA256SUMS"
