package affinity

import "fmt"

// BeginHook is an optional Policy hook: the Router calls OnBegin (under its
// write lock) when a request is sent to replica id.
type BeginHook interface {
	OnBegin(id ReplicaID, req *Request)
}

// RemoveHook is an optional Policy hook: the Router calls OnRemove (under its
// write lock) when replica id is removed; the id may be reused later.
type RemoveHook interface {
	OnRemove(id ReplicaID)
}

// policies is the one list of built-in policies, in documentation order.
var policies = []struct {
	name string
	make func(cfg Config) Policy
}{
	{"cost", func(cfg Config) Policy { return &CostPolicy{cfg: cfg} }},
	{"round-robin", func(Config) Policy { return &RoundRobin{} }},
	{"least-request", func(Config) Policy { return LeastRequest{} }},
	{"power-of-two", func(Config) Policy { return PowerOfTwo{} }},
	{"consistent-hash", func(cfg Config) Policy { return &ConsistentHash{cfg: cfg} }},
	{"prefix", func(Config) Policy { return PrefixOnly{} }},
	{"session", func(cfg Config) Policy { return newSession(cfg) }},
}

// PolicyNames lists the built-in policy names; the first is the default.
func PolicyNames() []string {
	out := make([]string, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	return out
}

func knownPolicy(name string) bool {
	for _, p := range policies {
		if p.name == name {
			return true
		}
	}
	return false
}

// NewPolicy builds the named policy; cfg zero fields take defaults.
func NewPolicy(name string, cfg Config) (Policy, error) {
	cfg = cfg.WithDefaults()
	for _, p := range policies {
		if p.name == name {
			return p.make(cfg), nil
		}
	}
	return nil, fmt.Errorf("policy %q: want one of %v", name, PolicyNames())
}
