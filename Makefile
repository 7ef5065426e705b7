# Forgeyard Transport — the two commands are `make demo` and `make test`.
# Every target installs what it needs (Go modules through the module proxy,
# Go tools with `go install`) and is safe to run again.

GO       ?= go
GOBIN    := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

STATICCHECK_VERSION := v0.7.0
BENCHSTAT_VERSION   := v0.0.0-20260908200009-22c9c6c9d4da
APIDIFF_VERSION     := v0.0.0-20261113113407-e3970619a1a4
ACTIONLINT_VERSION  := v1.7.12
FUZZTIME ?= 30s
BENCHCOUNT ?= 6
OUT := out

.PHONY: all demo demo-vectors matrix release scale soak test test-short lint api-check api-report fmt vet layering staticcheck bench bench-codec bench-backends bench-authority fuzz deps tools clean help

all: test

help:
	@echo "make demo      daemon + agents over QUIC, WebTransport, TLS+yamux and a relay: leases, a cut connection, resync, summary"
	@echo "make demo-vectors  decode and print every golden vector with the protocol inspector"
	@echo "make test      vet, layering check and every test with -race (fuzz seed corpora included; the quick compatibility matrix), then the short fault-injection soak (500 lifecycles)"
	@echo "make matrix    full cross-version compatibility matrix: builds tagged releases, runs every cell; rewrites matrix/results.json and docs/compatibility.md"
	@echo "make scale     the fleet-scale ladder (forgeyard-loadgen): real agents against one daemon process; writes $(OUT)/scale.md (SCALE_LADDER=quic:200 for a short run; work dirs under $(OUT)/_scale-work, which go ./... ignores)"
	@echo "make release   static linux/amd64+arm64 archives (binaries, man pages, completions, systemd units), OCI images of daemon/agent/relay, SHA256SUMS in out/release (VERSION=...)"
	@echo "make lint      gofmt check, go vet, staticcheck, actionlint, layering check, API check against the last release, go mod tidy -diff"
	@echo "make api-report  rewrite docs/api-changes.md after an exported API change (docs/api.md)"
	@echo "make bench     codec and backend benchmarks; tables for docs/perf.md (BENCHCOUNT=$(BENCHCOUNT))"
	@echo "make bench-authority  authority completions/renewals per second with group commit beside a single-row-transaction baseline (docs/perf.md)"
	@echo "make soak      fault-injection soak: 10,000 lease lifecycles over memory, QUIC, TLS+yamux and WebTransport with cuts, duplicate/early cancels, authority errors and latency, daemon crash/restart and clock steps; then the same lifecycles without faults (SOAK_SEED=, SOAK_N=, SOAK_BACKENDS=, SOAK_SKIP=; a failure prints the command that replays its seed)"
	@echo "make fuzz      every fuzz target for FUZZTIME each (default $(FUZZTIME)); FUZZ=regexp, FUZZJOBS=n targets at once (default: cores), FUZZPARALLEL=n, FUZZKEEP=n (see .ci/fuzz.sh)"

deps:
	./.ci/ensure-debs.sh
	$(GO) mod download
	./.ci/ensure-versitygw.sh

tools:
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@test -x $(GOBIN)/benchstat || $(GO) install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
	@test -x $(GOBIN)/apidiff || $(GO) install golang.org/x/exp/cmd/apidiff@$(APIDIFF_VERSION)
	@test -x $(GOBIN)/actionlint || $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

demo: deps
	$(GO) run ./cmd/forgeyard-demo

demo-vectors: deps
	$(GO) run ./cmd/forgeyard-protocol-inspect vectors

# The full compatibility matrix (docs/compatibility.md). Old releases are
# built from their git tags and cached under $$XDG_CACHE_HOME/forgeyard-matrix.
matrix: deps
	$(GO) run ./cmd/forgeyard-matrix

# The fleet-scale ladder (docs/perf.md, "Fleet scale"): forgeyard-loadgen runs
# N real agents against a forgeyard-daemon process it starts, step by step,
# each bounded by SCALE_STEP_TIMEOUT (a step that runs out still gets its
# row), and writes the table to $(OUT)/scale.md; each step keeps its work
# directory (daemon.log, the cached runner certificates) under
# $(OUT)/_scale-work. SCALE_LADDER overrides the
# steps (backend:N[:kill+graceful+ramp=D], comma-separated), e.g.
# `make scale SCALE_LADDER=quic:200,yamux:200:kill`.
SCALE_LADDER ?=
SCALE_STEP_TIMEOUT ?= 4m
SCALE_STEADY ?= 30s
SCALE_HEARTBEAT ?= 10s
SCALE_LEASE_RATE ?= 20
SCALE_PROFILE ?= 20s
scale: deps
	@mkdir -p bin $(OUT)
	$(GO) build -o bin/ ./cmd/forgeyard-daemon ./cmd/forgeyard-loadgen
	rm -f $(OUT)/_scale-work/step*/*.pprof
	SCALE_LADDER="$(SCALE_LADDER)" ./bin/forgeyard-loadgen ladder --out $(OUT)/scale.md --dir $(OUT)/_scale-work --daemon-cmd ./bin/forgeyard-daemon \
		--timeout $(SCALE_STEP_TIMEOUT) --steady $(SCALE_STEADY) --heartbeat $(SCALE_HEARTBEAT) --lease-rate $(SCALE_LEASE_RATE) \
		--profile $(SCALE_PROFILE); rc=$$?; \
	for p in $(OUT)/_scale-work/step*/*.pprof; do \
		[ -s "$$p" ] || continue; bin=./bin/forgeyard-daemon; case "$$p" in *loadgen*) bin=./bin/forgeyard-loadgen;; esac; \
		echo "== $$p"; $(GO) tool pprof -top -nodecount=25 $$bin "$$p" 2>/dev/null; \
	done > $(OUT)/scale-profiles.txt; echo "daemon and loadgen profiles (top 25 of each): $(OUT)/scale-profiles.txt"; exit $$rc

# ---- fault-injection soak (issue 15 item 6; internal/testkit/soak, docs/perf.md
# "Fault-injection soak") ----
# SOAK_N lifecycles over SOAK_BACKENDS with every fault kind (SOAK_SKIP
# leaves kinds out), bounded by SOAK_TIMEOUT, then SOAK_BASELINE_N of the same
# lifecycles without faults (the baseline beside the figure). SOAK_SEED=0 seeds
# from the clock; the seed and a digest of the fault schedule are printed, and
# a failure prints the one command that replays the schedule. Without -race:
# `make test` runs the short version (500 lifecycles) with -race.
SOAK_SEED ?= 0
SOAK_N ?= 10000
SOAK_BASELINE_N ?= 2000
SOAK_BACKENDS ?= memory,quic,yamux,webtransport
SOAK_SKIP ?=
SOAK_INFLIGHT ?= 16
SOAK_TIMEOUT ?= 10m
soak: deps
	$(GO) test ./internal/testkit/soak -run '^TestSoak$$' -count=1 -v -timeout 30m -soak.seed=$(SOAK_SEED) -soak.n=$(SOAK_N) \
		-soak.backends=$(SOAK_BACKENDS) -soak.skip=$(SOAK_SKIP) -soak.inflight=$(SOAK_INFLIGHT) -soak.timeout=$(SOAK_TIMEOUT)
	$(GO) test ./internal/testkit/soak -run '^TestSoak$$' -count=1 -v -timeout 30m -soak.seed=$(SOAK_SEED) -soak.n=$(SOAK_BASELINE_N) \
		-soak.backends=$(SOAK_BACKENDS) -soak.faults=false -soak.inflight=$(SOAK_INFLIGHT) -soak.timeout=$(SOAK_TIMEOUT)
# ---- end fault-injection soak ----

# Release archives and OCI image tarballs in out/release (.ci/release.sh,
# docs/operations.md "Releases and packages").
release:
	./.ci/release.sh

test: deps vet layering
	$(GO) test -race -shuffle=on -timeout 10m ./...
	@# The short fault-injection soak (issue 15 item 6): ≥ 500 seeded lifecycles over memory,
	@# QUIC and TLS+yamux with every fault kind, alone so no other package starves it.
	FORGEYARD_SOAK=1 $(GO) test -race -count=1 -timeout 6m -run '^TestSoak$$' ./internal/testkit/soak -soak.inflight=4

test-short: deps
	$(GO) test -short -timeout 10m ./...

vet:
	$(GO) vet ./...

# The layering rule has one copy, internal/testkit/deptest (ARCHITECTURE.md, docs/architecture.md):
# imports between wire, semantics, backends, relay and cmd, the map of semantics/ in
# semantics/doc.go, the pure contract; each with the test proving it catches a planted fault.
layering:
	$(GO) test -count=1 -run '^(TestLayering|TestRuleCatchesViolations|TestSemanticsMap|TestSemanticsMapCatchesViolations|TestContractDeps|TestInternalMap|TestInternalMapCatchesViolations|TestInternalPlaces|TestInternalPlacesCatchViolations)$$' ./internal/testkit/deptest

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: deps tools vet layering api-check
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-formatted:"; echo "$$unformatted"; exit 1; fi
	staticcheck ./...
	actionlint .github/workflows/*.yml
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }

# The exported API of docs/api.md's stable packages against the last release of
# matrix/manifest.json must equal the committed docs/api-changes.md (about 15 s warm,
# 25 s with a cold build cache for the release worktree).
api-check: tools
	./.ci/apidiff.sh check

# Rewrites the generated block of docs/api-changes.md after an API change.
api-report: tools
	./.ci/apidiff.sh report

bench: bench-codec bench-backends bench-authority

bench-codec: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test ./wire/internal/codecbench/ -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) | tee $(OUT)/bench/codec.txt
	benchstat $(OUT)/bench/codec.txt

bench-backends: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test ./backends/... -run '^$$' -bench . -benchmem -count 3 -timeout 60m | tee $(OUT)/bench/backends.txt
	benchstat $(OUT)/bench/backends.txt

# Authority throughput with group commit beside a same-run baseline of
# single-row transactions, on durable stores (SQLite synchronous=FULL,
# PostgreSQL with fsync on); then 10,000 agents renewing every 10 s.
bench-authority: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test ./semantics/authority/ -run '^$$' -bench 'GroupCommit' -benchtime 5000x -count $(BENCHCOUNT) -timeout 60m | tee $(OUT)/bench/authority.txt
	$(GO) test ./semantics/authority/ -run '^$$' -bench 'RenewFleet' -benchtime 1x -count 3 -timeout 60m | tee -a $(OUT)/bench/authority.txt
	benchstat $(OUT)/bench/authority.txt

# --- bench-wan (issue 19): every backend and the relay beside the raw libraries on
# emulated WAN paths (internal/tools/netsim: RTT 0/10/50/100 ms x loss 0/0.5 %, 50 Mbit/s).
# Also a quic row with 4 MiB/8 MiB receive windows (FY_WAN_VARIANTS=wan; "wan,hint" adds the
# delay hint). Prints the tables and writes $(OUT)/bench-wan.md; about 17 minutes on 2 cores
# (FY_WAN_PATHS, FY_WAN_BACKENDS, FY_WAN_MEASURE narrow it; see internal/testkit/wanbench).
.PHONY: bench-wan
bench-wan:
	@mkdir -p $(OUT)
	FY_WAN_OUT=$(abspath $(OUT))/bench-wan.md FY_WAN_VARIANTS=$${FY_WAN_VARIANTS-wan} $(GO) test ./internal/testkit/wanbench/ -run '^$$' -bench 'BenchmarkWAN$$' -benchtime 1x -count 1 -timeout 40m
	@echo "tables written to $(OUT)/bench-wan.md"
# --- end bench-wan

fuzz: deps
	FUZZTIME=$(FUZZTIME) FUZZ="$(FUZZ)" FUZZPARALLEL="$(FUZZPARALLEL)" FUZZKEEP="$(FUZZKEEP)" FUZZMINIMIZETIME="$(FUZZMINIMIZETIME)" FUZZJOBS="$(FUZZJOBS)" FUZZLOGDIR="$(FUZZLOGDIR)" ./.ci/fuzz.sh

clean:
	rm -rf $(OUT) bin

# --- capacity model (docs/capacity.md; h-capacity) -------------------------
# `make capacity` prints the 100,000-agent model, its sensitivity and the
# database simulation from docs/perf/capacity-inputs.json. After a new
# ladder table lands in docs/perf.md §10 or new `make bench-authority`
# output in docs/perf/authority-bench.txt, `make capacity-inputs` rebuilds
# the inputs (set CAPACITY_AUTH_COMMIT/DATE to the benchmark's commit and
# date); TestInputsAreTheImportOfTheirSources fails until it is run.
CAPACITY_AUTH_COMMIT ?= 2343909
CAPACITY_AUTH_DATE ?= 2026-12-02
.PHONY: capacity capacity-inputs
capacity:
	$(GO) run ./internal/tools/capacity/cmd/capacity model
	$(GO) run ./internal/tools/capacity/cmd/capacity sensitivity
	$(GO) run ./internal/tools/capacity/cmd/capacity simulate --k 15
	$(GO) run ./internal/tools/capacity/cmd/capacity simulate --k 15 --herd
capacity-inputs:
	$(GO) run ./internal/tools/capacity/cmd/capacity import --scale docs/perf.md --authority docs/perf/authority-bench.txt \
		--authority-commit $(CAPACITY_AUTH_COMMIT) --authority-date $(CAPACITY_AUTH_DATE) > docs/perf/capacity-inputs.json.tmp
	mv docs/perf/capacity-inputs.json.tmp docs/perf/capacity-inputs.json

# --- h-yamux (issue 19 items 3-4): TLS+yamux parity and the relay's CPU per GiB ---
# Interleaved rounds of raw TLS+yamux vs ours (bulk, control under bulk, with
# cpu-s/GiB), then the relay's CPU per GiB beside its two raw legs and the
# control RTT through the relay under scheduler-paced bulk. ~6 min on 2 cores.
.PHONY: bench-yamux-relay
bench-yamux-relay: deps tools
	@mkdir -p $(OUT)/bench
	$(GO) test -c -o $(OUT)/bench/yamux.test ./backends/yamux
	$(GO) test -c -o $(OUT)/bench/relay.test ./relay
	rm -f $(OUT)/bench/yamux-relay.txt
	for r in 1 2 3 4 5 6; do \
	  $(OUT)/bench/yamux.test -test.run '^$$' -test.bench 'BenchmarkBulk/(raw|ours)/' -test.benchtime 500x | tee -a $(OUT)/bench/yamux-relay.txt; \
	  $(OUT)/bench/yamux.test -test.run '^$$' -test.bench 'BenchmarkControlUnderBulk/(raw|ours)$$' -test.benchtime 1000x | grep -v 'ours/' | tee -a $(OUT)/bench/yamux-relay.txt; \
	  (cd relay && $(abspath $(OUT))/bench/relay.test -test.run '^$$' -test.bench 'BenchmarkRelayCPU$$|BenchmarkRelayControlUnderBulkPaced' -test.benchtime 1x) | tee -a $(OUT)/bench/yamux-relay.txt; \
	done
	benchstat $(OUT)/bench/yamux-relay.txt
# --- end h-yamux ---
