#!/bin/sh
# Regenerates the bpf2go output (run through `go generate ./bpf/...`).
# The compiler defaults to the pinned clang-14 so output is reproducible;
# override with BPF2GO_CC / BPF2GO_STRIP.
set -eu
exec go run github.com/cilium/ebpf/cmd/bpf2go \
	-cc "${BPF2GO_CC:-clang-14}" \
	-strip "${BPF2GO_STRIP:-llvm-strip}" \
	-target bpfel \
	-go-package bpf \
	-type svc_key -type svc_val -type aff_key -type aff_val -type backend \
	-type flow_key -type flow_val -type config -type counter -type nexthop -type flow_cache_slot \
	-type counter_idx -type backend_counter_slot -type ready_slot \
	Warmpath warmpath.c -- -mcpu=v3 -Wall -Werror -I.
