package steer

import (
	"net/netip"

	"github.com/warmpath/warmpath/affinity"
)

// The controller's two inputs from the slowpath, defined here so that this
// package imports only affinity and fastpath; cmd/warmpath adapts
// *slowpath.Server to Source and slowpath.RoutedEvent to Routed.

// Source is what Sync reads from the slowpath every step.
type Source interface {
	// Replicas lists the replicas with their health and fast-path host.
	Replicas() []Replica
	// Router is the routing brain (loads, prefill rates).
	Router() *affinity.Router
	// Now is the router's clock, the one of Routed.End.
	Now() int64
}

// Replica is one slowpath replica as the controller maps it to a backend.
type Replica struct {
	// ID is the replica's affinity.ReplicaID (negative: none).
	ID int
	// Host is the replica's fast-path GPU host, an IPv4 literal; empty or
	// anything else means the replica is not steerable.
	Host string
	// Healthy is the slowpath's health (checks and passive ejection).
	Healthy bool
}

// Routed is one proxied request, the fields of slowpath.RoutedEvent the
// promotion rule needs. ObserveRouted does not keep it past the call.
type Routed struct {
	Client                netip.AddrPort     // the client's address (IPv4 unmapped)
	ReplicaID             affinity.ReplicaID // the replica that served it
	FirstBlock            uint64             // first block hash of the canonical prompt; 0 = none
	SessionKey            uint64             // affinity.Request.SessionKey; 0 = none
	PromptTokens          int                // estimated prompt tokens
	PredictedCachedTokens int                // what the router predicted was cached there
	OK                    bool               // the response completed without error
	End                   int64              // completion, ns on the router's clock
}
