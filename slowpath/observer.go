package slowpath

import (
	"net/netip"

	"github.com/warmpath/warmpath/affinity"
)

// Observer is the seam for the fast path: it is told about every request
// the router proxied to a replica, after the response completed (for a
// stream: after its last byte). It runs on the request's goroutine, so it
// must not block, and must not keep ev or ev.Model past the call.
//
// Set Server.Observer before Serve; nil (the default) means none.
type Observer interface {
	ObserveRouted(ev *RoutedEvent)
}

// RoutedEvent describes one proxied request.
type RoutedEvent struct {
	Client                netip.AddrPort // the client's address as the router saw it
	Model                 []byte         // requested model; valid during the call only
	Replica               string         // replica name (its host:port)
	ReplicaID             affinity.ReplicaID
	PredictedCachedTokens int  // what the router predicted was cached there
	CachedTokens          int  // what the engine reported; -1 = not reported
	Status                int  // upstream HTTP status
	OK                    bool // the response completed without error
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ev *RoutedEvent)

// ObserveRouted calls f(ev).
func (f ObserverFunc) ObserveRouted(ev *RoutedEvent) { f(ev) }

var _ Observer = ObserverFunc(nil)
