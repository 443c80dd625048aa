package live

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/internal/child"
	"github.com/warmpath/warmpath/bench/llamacpp"
	"github.com/warmpath/warmpath/bench/workload"
)

// Fleet names (Options.Fleets).
const (
	FleetEnginesim = "enginesim"         // Options.Engines enginesim processes, defaults
	FleetSeqs4     = "enginesim-seqs4"   // the same with --max-num-seqs 4: engines queue early
	FleetSeqs16    = "enginesim-seqs16"  // --max-num-seqs 16
	FleetHetero    = "enginesim-hetero"  // the last engine HeteroSlowdown times slower
	FleetNoCache   = "enginesim-nocache" // --no-enable-prefix-caching: nothing cached between requests
	FleetLlamacpp  = "llamacpp"          // real llama-server processes (bench/llamacpp), one core each
	// FleetLlamaSmallCache: the same with a host prompt cache that holds
	// a few prompts (--cache-ram 4), running multi-turn alone with three
	// times the conversations and longer histories.
	FleetLlamaSmallCache = "llamacpp-smallcache"
	// FleetLlamaTenants: the same small host cache, running shared-prefix
	// alone with twice as many system prompts as the servers have slots.
	FleetLlamaTenants = "llamacpp-tenants"
)

// Fleets lists every fleet, in report order.
func Fleets() []string {
	return []string{FleetEnginesim, FleetSeqs4, FleetSeqs16, FleetHetero, FleetNoCache, FleetLlamacpp, FleetLlamaSmallCache, FleetLlamaTenants}
}

// fleet is one kind of engine cluster behind the routers.
type fleet struct {
	name, about string
	engines     int
	timeScale   float64 // wall seconds per model second; 1 for real engines (wall time)
	llama       bool
	args        func(i int) []string // extra enginesim flags of engine i
	kvTokens    int                  // per replica, for warmpath's kv_capacity_tokens
	prefillRate float64              // warmpath's seed prefill rate, tokens per wall second
	rps         []float64
	requests    int
	llamaArgs   []string // extra llama-server flags
	chats       int      // multi-turn conversations; 0 = the fleet kind's default
	groups      int      // shared-prefix groups, run alone; 0 = the fleet kind's default, with the others
}

// fleetSpec describes fleet name under o (defaults filled in).
func fleetSpec(o Options, name string) (fleet, error) {
	f := fleet{name: name, engines: o.Engines, timeScale: o.TimeScale, args: func(int) []string { return nil },
		kvTokens: 16 * o.EngineKVBlocks, prefillRate: 25000 / o.TimeScale, rps: o.RPS, requests: o.Requests}
	seqs := func(n int) func(int) []string {
		return func(int) []string { return []string{"--max-num-seqs", strconv.Itoa(n)} }
	}
	switch name {
	case FleetEnginesim:
		f.about = fmt.Sprintf("%d enginesim engines (simulated vLLM), defaults (max-num-seqs 1024)", f.engines)
	case FleetSeqs4:
		f.about, f.args = fmt.Sprintf("%d enginesim engines, `--max-num-seqs 4`: requests queue in the engine beyond 4 running", f.engines), seqs(4)
	case FleetSeqs16:
		f.about, f.args = fmt.Sprintf("%d enginesim engines, `--max-num-seqs 16`", f.engines), seqs(16)
	case FleetHetero:
		slow := o.HeteroSlowdown
		f.about = fmt.Sprintf("%d enginesim engines, the last one %gx slower (every step-time term scaled)", f.engines, slow)
		f.args = func(i int) []string {
			if i != f.engines-1 {
				return nil
			}
			t := enginesim.DefaultTiming()
			d := func(x time.Duration) string { return time.Duration(float64(x) * slow).String() }
			return []string{"--step-base", d(t.StepBase), "--per-prefill-token", d(t.PerPrefillToken),
				"--per-decode-seq", d(t.PerDecodeSeq), "--per-context-token", d(t.PerContextToken)}
		}
	case FleetNoCache:
		f.about = fmt.Sprintf("%d enginesim engines, `--no-enable-prefix-caching` (their /metrics say so in cache_config_info)", f.engines)
		f.args = func(int) []string { return []string{"--no-enable-prefix-caching"} }
	case FleetLlamacpp:
		f.engines, f.timeScale, f.llama = o.LlamaServers, 1, true
		f.about = fmt.Sprintf("%d llama.cpp llama-server processes (tiny random-weight model, %d slots x %d tokens, one core each)",
			o.LlamaServers, o.LlamaSlots, o.LlamaCtxPerSlot)
		f.kvTokens, f.prefillRate, f.rps, f.requests = o.LlamaSlots*o.LlamaCtxPerSlot, 6000, o.LlamaRPS, o.LlamaRequests
	case FleetLlamaSmallCache:
		// The tiny model's KV is 1 KiB a token, so llama.cpp's default 8 GiB
		// host cache holds every prompt a run sends and no conversation's
		// history is ever lost. An 8B model's is 128 KiB a token: there the
		// default holds 65,536 tokens, some 18 of the simulator's
		// conversations. 4 MiB holds 4,096 tokens here, two or three of
		// these conversations' prompts, and with 24 conversations the
		// slots and host caches of two servers hold about half of them.
		f.engines, f.timeScale, f.llama = o.LlamaServers, 1, true
		f.llamaArgs, f.chats = []string{"--cache-ram", "4"}, 24
		f.about = fmt.Sprintf("%d llama.cpp llama-server processes (tiny random-weight model, %d slots x %d tokens, one core each), "+
			"`--cache-ram 4`: a host prompt cache of 4,096 tokens, a few prompts, as an 8B model's default 8 GiB holds some 18 long ones; "+
			"multi-turn with 24 conversations of 6-8 turns whose own history outweighs the system prompt", o.LlamaServers, o.LlamaSlots, o.LlamaCtxPerSlot)
		f.kvTokens, f.prefillRate, f.rps, f.requests = o.LlamaSlots*o.LlamaCtxPerSlot, 6000, o.LlamaRPS, 4*o.LlamaRequests
	case FleetLlamaTenants:
		// Twice as many 2,048-token system prompts as the servers have
		// slots, and a host cache of two: the slots hold half the groups,
		// so which server a group's request goes to decides whether its
		// prompt is there (with the default cache the tiny model's
		// prompts all stay in RAM and every policy reuses them).
		f.engines, f.timeScale, f.llama = o.LlamaServers, 1, true
		f.llamaArgs, f.groups = []string{"--cache-ram", "4"}, 2*o.LlamaServers*o.LlamaSlots
		f.about = fmt.Sprintf("%d llama.cpp llama-server processes (tiny random-weight model, %d slots x %d tokens, one core each), "+
			"`--cache-ram 4`: a host prompt cache of two system prompts; shared-prefix with %d groups, twice the slots",
			o.LlamaServers, o.LlamaSlots, o.LlamaCtxPerSlot, f.groups)
		f.kvTokens, f.prefillRate, f.rps, f.requests = o.LlamaSlots*o.LlamaCtxPerSlot, 6000, o.LlamaRPS, 2*o.LlamaRequests
	default:
		return fleet{}, fmt.Errorf("unknown fleet %q (have %v)", name, Fleets())
	}
	return f, nil
}

// startEngines starts n engines of fleet f (fresh: cold caches), adds
// them to g and returns their addresses and a stop for what g does not
// hold (llama-server fleets).
func startEngines(ctx context.Context, o Options, f fleet, n int, g *child.Group) ([]string, func() error, func(), error) {
	if f.llama {
		lf, err := llamacpp.Start(ctx, llamacpp.Options{N: n, Slots: o.LlamaSlots, CtxPerSlot: o.LlamaCtxPerSlot, Alias: workload.DefaultModel, Args: f.llamaArgs})
		if err != nil {
			return nil, nil, nil, err
		}
		return lf.Addrs(), lf.Failure, lf.Stop, nil
	}
	addrs := make([]string, n)
	for i := range addrs {
		p, addr, err := startEngine(ctx, o, uint64(i), f.args(i))
		if err != nil {
			return nil, nil, nil, err
		}
		g.Add(p)
		addrs[i] = addr
	}
	return addrs, func() error { return nil }, func() {}, nil
}

// Workloads lists the routing workloads' names (Options.Workloads), in
// report order.
func Workloads() []string {
	return []string{"shared-prefix", "one-company", "multi-turn", "no-sharing"}
}

// fleetWorkloads are the routing workloads for fleet f: shared-prefix
// groups, the one-company prompt, multi-turn chat and no-sharing (the
// do-no-harm check; smoke: the first two, smaller). llama.cpp's are sized
// to the tiny model's slots and one core's speed (rows of tens of wall
// seconds).
func fleetWorkloads(o Options, f fleet) []*workload.Workload {
	sp := workload.DefaultSharedPrefix()
	sp.Seed, sp.Groups, sp.PromptsPerGroup, sp.OutputTokens = o.Seed, 32, 16, 64
	oc := workload.DefaultOneCompany()
	oc.Seed, oc.OutputTokens = o.Seed, 64
	mt := workload.DefaultMultiTurn()
	mt.Seed, mt.Conversations, mt.MinTurns, mt.MaxTurns, mt.AnswerTokens, mt.ThinkSeconds = o.Seed, 48, 8, 12, 64, 4
	ns := workload.DefaultNoSharing()
	ns.Seed, ns.OutputTokens = o.Seed, 64
	sp.SharedSeed, oc.SharedSeed, mt.SharedSeed = o.sharedSeed, o.sharedSeed, o.sharedSeed
	if f.llama {
		sp.Groups, sp.PromptsPerGroup, sp.QuestionTokens, sp.OutputTokens = 8, 8, 64, 32
		oc.OutputTokens, oc.BurstSize, oc.Users = 32, 8, 32
		mt.Conversations, mt.MinTurns, mt.MaxTurns, mt.QuestionTokens, mt.AnswerTokens, mt.ThinkSeconds = 8, 4, 6, 64, 32, 2
		ns.MaxTokens, ns.OutputTokens = 2048, 32
	}
	if f.groups > 0 {
		sp.Groups, sp.PromptsPerGroup = f.groups, 10
	}
	if f.chats > 0 {
		// chats whose own history outweighs the system prompt (up to
		// 512 + 8 x 192 tokens), so losing it costs what it does in
		// long conversations
		mt.Conversations, mt.SharedTokens, mt.QuestionTokens, mt.AnswerTokens, mt.MinTurns, mt.MaxTurns = f.chats, 512, 128, 64, 6, 8
	}
	if o.Smoke {
		sp.Groups, sp.PromptsPerGroup, sp.SystemTokens, sp.OutputTokens = 6, 8, 1024, 16
		oc.InstructionTokens, oc.OutputTokens, oc.BurstSize = 2048, 16, 8
	}
	var out []*workload.Workload
	add := func(w *workload.Workload, err error) {
		if err == nil {
			out = append(out, w)
		}
	}
	add(workload.SharedPrefix(sp))
	add(workload.OneCompany(oc))
	if !o.Smoke {
		add(workload.MultiTurn(mt))
		add(workload.NoSharing(ns))
	}
	out = slices.DeleteFunc(out, func(w *workload.Workload) bool {
		// a fleet sized for its conversations or groups runs only them
		return len(o.Workloads) > 0 && !slices.Contains(o.Workloads, w.Name) || f.chats > 0 && w.Name != "multi-turn" ||
			f.groups > 0 && w.Name != "shared-prefix"
	})
	for _, w := range out {
		if len(w.Requests) > f.requests {
			w.Requests = w.Requests[:f.requests]
		}
	}
	return out
}

// knownFleets checks names against Fleets.
func knownFleets(names []string) error {
	for _, n := range names {
		if !slices.Contains(Fleets(), n) {
			return fmt.Errorf("unknown fleet %q (have %v)", n, Fleets())
		}
	}
	return nil
}
