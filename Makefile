# Forgeyard Transport — the two commands are `make demo` and `make test`.
# Every target installs what it needs (Go modules through the module proxy,
# Go tools with `go install`) and is safe to run again.

GO       ?= go
GOBIN    := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

STATICCHECK_VERSION := v0.7.0
BENCHSTAT_VERSION   := v0.0.0-20260908200009-22c9c6c9d4da
APIDIFF_VERSION     := v0.0.0-20261113113407-e3970619a1a4
FUZZTIME ?= 30s
BENCHCOUNT ?= 6
OUT := out

.PHONY: all demo demo-vectors matrix test test-short lint api-check api-report fmt vet layering staticcheck bench bench-codec bench-backends fuzz deps tools clean help

all: test

help:
	@echo "make demo      daemon + agents over QUIC, WebTransport, TLS+yamux and a relay: leases, a cut connection, resync, summary"
	@echo "make demo-vectors  decode and print every golden vector with the protocol inspector"
	@echo "make test      vet, layering check and every test with -race (fuzz seed corpora included; the quick compatibility matrix)"
	@echo "make matrix    full cross-version compatibility matrix: builds tagged releases, runs every cell; rewrites matrix/results.json and docs/compatibility.md"
	@echo "make lint      gofmt check, go vet, staticcheck, layering check, API check against the last release, go mod tidy -diff"
	@echo "make api-report  rewrite docs/api-changes.md after an exported API change (docs/api.md)"
	@echo "make bench     codec and backend benchmarks; tables for docs/perf.md (BENCHCOUNT=$(BENCHCOUNT))"
	@echo "make fuzz      every fuzz target for FUZZTIME each (default $(FUZZTIME)); FUZZ=regexp, FUZZJOBS=n targets at once (default: cores), FUZZPARALLEL=n, FUZZKEEP=n (see .ci/fuzz.sh)"

deps:
	./.ci/ensure-debs.sh
	$(GO) mod download
	./.ci/ensure-versitygw.sh

tools:
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@test -x $(GOBIN)/benchstat || $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	@test -x $(GOBIN)/apidiff || $(GO) install golang.org/x/exp/cmd/apidiff@$(APIDIFF_VERSION)

demo: deps
	$(GO) run ./cmd/forgeyard-demo

demo-vectors: deps
	$(GO) run ./cmd/forgeyard-protocol-inspect vectors

# The full compatibility matrix (docs/compatibility.md). Old releases are
# built from their git tags and cached under $$XDG_CACHE_HOME/forgeyard-matrix.
matrix: deps
	$(GO) run ./cmd/forgeyard-matrix

test: deps vet layering
	$(GO) test -race -shuffle=on -timeout 10m ./...

test-short: deps
	$(GO) test -short -timeout 10m ./...

vet:
	$(GO) vet ./...

layering:
	./.ci/check-layering.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: deps tools vet layering api-check
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-formatted:"; echo "$$unformatted"; exit 1; fi
	staticcheck ./...
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }

# The exported API of docs/api.md's stable packages against the last release of
# matrix/manifest.json must equal the committed docs/api-changes.md (about 15 s warm,
# 25 s with a cold build cache for the release worktree).
api-check: tools
	./.ci/apidiff.sh check

# Rewrites the generated block of docs/api-changes.md after an API change.
api-report: tools
	./.ci/apidiff.sh report

bench: bench-codec bench-backends

bench-codec: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test ./wire/internal/codecbench/ -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) | tee $(OUT)/bench/codec.txt
	benchstat $(OUT)/bench/codec.txt

bench-backends: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test ./backends/... -run '^$$' -bench . -benchmem -count 3 -timeout 60m | tee $(OUT)/bench/backends.txt
	benchstat $(OUT)/bench/backends.txt

fuzz: deps
	FUZZTIME=$(FUZZTIME) FUZZ="$(FUZZ)" FUZZPARALLEL="$(FUZZPARALLEL)" FUZZKEEP="$(FUZZKEEP)" FUZZMINIMIZETIME="$(FUZZMINIMIZETIME)" FUZZJOBS="$(FUZZJOBS)" FUZZLOGDIR="$(FUZZLOGDIR)" ./.ci/fuzz.sh

clean:
	rm -rf $(OUT) bin
