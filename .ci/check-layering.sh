#!/usr/bin/env bash
# Enforces the layering rule of ARCHITECTURE.md on the import graph:
#   wire ← semantics ← backends/relay ← cmd
#   only backends/quic and backends/webtransport import quic-go;
#   only backends/yamux imports yamux;
#   only semantics/objstore/s3store imports the S3 SDK (minio-go).
# Prints every offending import and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
# Production imports ("P") obey every rule; test imports ("T") may not pull
# quic-go or yamux outside their backends, nor make wire depend on anything.
go list -f '{{.ImportPath}} P {{join .Imports " "}} T {{join .TestImports " "}} {{join .XTestImports " "}}' ./... | awk -v m="$mod" '
{ pkg=$1; mode="P"
  for (i=2;i<=NF;i++) { imp=$i
    if (imp == "P" || imp == "T") { mode=imp; continue }
    if (imp ~ /quic-go\/quic-go|quic-go\/webtransport-go/ && pkg !~ "^" m "/backends/(quic|webtransport)(/|$)") print pkg " imports " imp
    if (imp ~ /hashicorp\/yamux/ && pkg !~ "^" m "/backends/yamux(/|$)") print pkg " imports " imp
    if (imp ~ /minio\/minio-go/ && pkg !~ "^" m "/semantics/objstore/s3store(/|$)") print pkg " imports " imp
    if (pkg ~ "^" m "/wire(/|$)" && imp ~ "^" m "/(semantics|backends|relay|cmd|matrix)(/|$)") print pkg " imports " imp
    if (mode == "P" && pkg ~ "^" m "/semantics(/|$)" && imp ~ "^" m "/(backends|relay|cmd|matrix)(/|$)") print pkg " imports " imp
  } }' | sort -u > /tmp/layering.$$ || true
if [ -s /tmp/layering.$$ ]; then
  echo "layering violations (see ARCHITECTURE.md):"
  cat /tmp/layering.$$
  rm -f /tmp/layering.$$
  exit 1
fi
rm -f /tmp/layering.$$
echo "layering: ok"
