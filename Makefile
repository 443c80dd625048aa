# warmpath: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# bpf2go output depends on the compiler: generate pins clang 14 (Debian 12's).
CLANG ?= clang-14
export BPF2GO_CC := $(CLANG)
export BPF2GO_STRIP := llvm-strip
TESTFLAGS ?= -race -shuffle=on -count=1 -timeout 12m

.PHONY: help build reproducible image licenses licenses-check test test-short soak bench bench-micro bench-once fuzz generate generate-check lint demo clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# Release builds: static (no cgo), no build paths (-trimpath), stamped from
# git, never from the wall clock (the date is the commit's), so two builds of
# one commit are byte for byte the same (`make reproducible` checks it).
BIN ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)
BUILDFLAGS := -trimpath -buildvcs=false -ldflags '$(LDFLAGS)'

build: ## static, reproducible binaries into ./bin: warmpath, warmpath-bench, enginesim (CGO_ENABLED=0, -trimpath)
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o $(BIN)/ ./cmd/...

reproducible: ## build twice, from this tree and from a copy elsewhere, and compare the binaries' sha256
	$(GO) test -count=1 -run '^TestReproducibleBuild$$' -v ./cmd/warmpath

IMAGE ?= warmpath:$(VERSION)

image: ## the container image (deploy/docker/Dockerfile: make build on distroless static, non-root)
	docker build -f deploy/docker/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
		--build-arg BUILD_DATE=$(BUILD_DATE) -t $(IMAGE) .

licenses: ## regenerate docs/licenses.md from go.mod and the module cache
	$(GO) test -count=1 -run '^TestThirdPartyLicenses$$' ./cmd/warmpath -update

licenses-check: ## fail when go.mod has a module (or version) docs/licenses.md does not list
	$(GO) test -count=1 -run '^TestThirdPartyLicenses$$' ./cmd/warmpath

demo: ## run the router in front of built-in simulated engines
	$(GO) run ./cmd/warmpath serve --demo

test: lint ## lint (vet, gofmt, staticcheck, import rules), race-tested suite (as root: BPF and netns tests too), zero-alloc tests, every benchmark once, every fuzz target for a fixed count of inputs
	$(GO) test $(TESTFLAGS) ./...
	# zero-allocation guarantees: the race detector allocates, so these also run without it
	$(GO) test -count=1 -run 'Alloc' ./...
	$(MAKE) bench-once
	$(MAKE) fuzz

test-short: ## quick tests, no race detector
	$(GO) test -short ./...

SOAK ?= 3m

soak: ## the slowpath soak (TestSoakChurn) for SOAK (default 3m), without -race; figures in docs/reliability.md
	$(GO) test -run '^TestSoakChurn$$' -count=1 -v -timeout 1h ./slowpath -soak=$(SOAK)

# Every fuzz target, as package:Target[:budget]. `make fuzz` runs each for
# FUZZTIME when given (a duration or a count like 50000x), else for its own
# budget, else FUZZEXECS. The defaults are counts, not durations: a duration
# races Go's fuzz coordinator at the deadline (golang/go#75804, unfixed in
# go1.26) and fails with a bare "context deadline exceeded" on a loaded host.
# FuzzEngine runs whole simulated fleets per input, so it gets fewer.
FUZZ_TARGETS := ./affinity:FuzzCanonicalize ./affinity:FuzzScanChat ./affinity:FuzzParseResponses ./bench/enginesim:FuzzAPIRequest ./bench/enginesim:FuzzEngine:1000x ./bench/enginesim:FuzzExtraRequest \
	./fastpath:FuzzSteer ./fastpath:FuzzDecap ./slowpath:FuzzParseConfig ./slowpath:FuzzSSEScan \
	./slowpath:FuzzSSERelay ./slowpath:FuzzUsageKey ./slowpath:FuzzHandler ./slowpath:FuzzParseEngineMetrics ./slowpath/cluster:FuzzDecode
FUZZEXECS ?= 20000x
FUZZTIME ?=

fuzz: ## run every fuzz target for a fixed count of inputs (FUZZTIME=30s or =1000000x to override; crashers land in testdata/fuzz/)
	@set -eo pipefail; for t in $(FUZZ_TARGETS); do IFS=: read -r pkg fn budget <<<"$$t"; \
		budget=$${budget:-$(FUZZEXECS)}; [ -z "$(FUZZTIME)" ] || budget=$(FUZZTIME); \
		echo "fuzz $$fn ($$pkg, $$budget)"; \
		out=$$($(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $$budget $$pkg 2>&1) || { echo "$$out"; exit 1; }; \
		echo "$$out" | tail -1; done

bench-once: ## run every benchmark once so none rots
	$(GO) test -run '^$$' -bench . -benchtime=1x ./...

bench: ## the bench suites (warmpath-bench): simulator report into bench/results/sim, live (real processes) into bench/results/live
	$(MAKE) build
	./bin/warmpath-bench sim --out bench/results/sim
	./bin/warmpath-bench live --out bench/results/live

bench-micro: ## Go micro-benchmarks with allocations, 5 counts (compare with benchstat)
	@mkdir -p bench/results
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./... | tee bench/results/micro.txt

generate: ## regenerate bpf2go output (needs clang 14, llvm, libbpf-dev)
	$(GO) generate ./bpf/...

generate-check: generate ## regenerate and fail if the committed output differs
	git diff --exit-code -- bpf/

# staticcheck, pinned; installed once into TOOLS with the go tool (the
# module proxy), so a clean CI machine needs nothing else.
STATICCHECK_VERSION ?= v0.8.2
TOOLS ?= $(CURDIR)/.tools
STATICCHECK ?= $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)/staticcheck

$(TOOLS)/staticcheck-$(STATICCHECK_VERSION)/staticcheck:
	GOBIN=$(@D) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK) ## go vet, gofmt, staticcheck (pinned) and the import rules (cmd/internal/layout)
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(STATICCHECK) ./...
	$(GO) test -count=1 ./cmd/internal/layout

clean: ## remove build output
	rm -rf bin
