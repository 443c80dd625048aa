# warmpath: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# bpf2go output depends on the compiler: generate pins clang 14 (Debian 12's).
CLANG ?= clang-14
export BPF2GO_CC := $(CLANG)
export BPF2GO_STRIP := llvm-strip
TESTFLAGS ?= -race -shuffle=on -count=1 -timeout 12m

.PHONY: help build test test-short soak bench bench-micro bench-once fuzz generate generate-check lint demo clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## build every binary into ./bin
	$(GO) build -o bin/ ./cmd/...

demo: ## run the router in front of built-in simulated engines
	$(GO) run ./cmd/warmpath serve --demo

test: lint ## vet, race-tested suite (as root: BPF and netns tests too), zero-alloc tests, every benchmark once, every fuzz target 5s
	$(GO) test $(TESTFLAGS) ./...
	# zero-allocation guarantees: the race detector allocates, so these also run without it
	$(GO) test -count=1 -run 'Alloc' ./...
	$(MAKE) bench-once
	$(MAKE) fuzz FUZZTIME=5s

test-short: ## quick tests, no race detector
	$(GO) test -short ./...

SOAK ?= 3m

soak: ## the slowpath soak (TestSoakChurn) for SOAK (default 3m), without -race; figures in docs/reliability.md
	$(GO) test -run '^TestSoakChurn$$' -count=1 -v -timeout 1h ./slowpath -soak=$(SOAK)

# Every fuzz target, as package:Target. `make fuzz` runs each for FUZZTIME.
FUZZ_TARGETS := ./affinity:FuzzCanonicalize ./bench/enginesim:FuzzAPIRequest ./bench/enginesim:FuzzEngine \
	./fastpath:FuzzSteer ./fastpath:FuzzDecap ./slowpath:FuzzParseConfig ./slowpath:FuzzSSEScan \
	./slowpath:FuzzSSERelay ./slowpath:FuzzHandler ./slowpath:FuzzParseEngineMetrics ./slowpath/cluster:FuzzDecode
FUZZTIME ?= 5s

fuzz: ## run every fuzz target for FUZZTIME (default 5s; crashers land in testdata/fuzz/)
	@set -eo pipefail; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn ($$pkg, $(FUZZTIME))"; \
		out=$$($(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg 2>&1) || { echo "$$out"; exit 1; }; \
		echo "$$out" | tail -1; done

bench-once: ## run every benchmark once so none rots
	$(GO) test -run '^$$' -bench . -benchtime=1x ./...

bench: ## the bench suites: simulator report into bench/results/sim, live (real processes) into bench/results/live
	$(GO) run ./cmd/warmpath bench sim --out bench/results/sim
	$(GO) build -o bin/ ./cmd/...
	./bin/warmpath bench live --out bench/results/live

bench-micro: ## Go micro-benchmarks with allocations, 5 counts (compare with benchstat)
	@mkdir -p bench/results
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./... | tee bench/results/micro.txt

generate: ## regenerate bpf2go output (needs clang 14, llvm, libbpf-dev)
	$(GO) generate ./bpf/...

generate-check: generate ## regenerate and fail if the committed output differs
	git diff --exit-code -- bpf/

lint: ## go vet and gofmt
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

clean: ## remove build output
	rm -rf bin
