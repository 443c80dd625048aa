package slowpath

import "github.com/warmpath/warmpath/affinity"

// brain is the subset of *affinity.Router the proxy drives: it keeps the
// proxy's dependency on affinity to these calls, and a fake could stand in
// (the tests use the real Router). Implementations must be safe for
// concurrent use.
type brain interface {
	AddReplica(spec affinity.ReplicaSpec) (affinity.ReplicaID, error)
	UpdateReplica(id affinity.ReplicaID, spec affinity.ReplicaSpec) error
	RemoveReplica(id affinity.ReplicaID)
	SetHealthy(id affinity.ReplicaID, healthy bool)
	SetSignals(id affinity.ReplicaID, s affinity.EngineSignals)
	ResetCache(id affinity.ReplicaID)
	Decide(req *affinity.Request, d *affinity.Decision) error
	Begin(id affinity.ReplicaID, req *affinity.Request, d *affinity.Decision, f *affinity.Flight)
	FirstToken(f *affinity.Flight, now int64)
	End(f *affinity.Flight, now int64, cachedTokens int, ok bool)
	EndWith(f *affinity.Flight, now int64, o affinity.Outcome)
}

// promptParser extracts the routing-relevant part of a request body. It need
// not be goroutine-safe: the server pools one per concurrent request.
type promptParser interface {
	ParseChat(body []byte, out *affinity.Prompt) error
	ParseCompletion(body []byte, out *affinity.Prompt) error
	ParseEmbedding(body []byte, out *affinity.Prompt) error
	ParseResponses(body []byte, out *affinity.Prompt) (prev []byte, err error)
}

var (
	_ brain        = (*affinity.Router)(nil)
	_ promptParser = (*affinity.Parser)(nil)
)
