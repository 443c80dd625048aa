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

// RoutedEvent describes one proxied request. It carries what
// affinity.Observation needs (client, replica, first block, session, prompt
// and predicted cached tokens, time), so a promotion rule can be fed from it
// directly. Slices are valid during the call only.
type RoutedEvent struct {
	Client                netip.AddrPort // the client's address as the router saw it (IPv4 unmapped)
	Model                 []byte         // requested model
	Replica               string         // replica name (its host:port)
	ReplicaID             affinity.ReplicaID
	Hashes                []uint64 // chained block hashes of the canonical prompt (Hashes[0] is the first block)
	SessionKey            uint64   // affinity.Request.SessionKey; 0 = none
	PromptTokens          int      // estimated prompt tokens
	PredictedCachedTokens int      // what the router predicted was cached there
	PredictedTTFT         float64  // the replica's TTFT model at Begin, seconds (affinity.Flight.PredictedTTFT); 0 = none
	BusyAtStart           int      // requests on the replica when this one began (this one not counted)
	CachedTokens          int      // what the engine reported; -1 = not reported
	Status                int      // upstream HTTP status
	OK                    bool     // the response completed without error
	Start, End            int64    // decision and completion, ns on the router's clock (the one given to affinity)
	Arrival               int64    // the request's arrival, same clock
	Held                  int64    // ns it waited at the router for a busy slot holding its prompt (routing.slot_hold); 0 = none
	FirstToken            int64    // the first output token (whole answer when not streamed), same clock; 0 = none
	ReportedPromptTokens  int      // usage.prompt_tokens from the engine; -1 = not reported
	OutputTokens          int      // usage.completion_tokens from the engine; -1 = not reported
	// The engine's own account of its prefill, where it gives one
	// (llama.cpp's timings.prompt_n and prompt_ms): the tokens it computed
	// and how long that took; 0 = not reported. The first token less this
	// is the time the request spent elsewhere (queued for a slot, the
	// router, the network).
	EnginePrefillTokens  int
	EnginePrefillSeconds float64
	// Holds is how many slot holds the request slept through before its
	// decision (woken by a request ending, decided again, held again);
	// HeldOn and HoldEnd are the last one's replica and how it ended
	// ("woken": a request ended somewhere; "expired": the advised wait
	// passed). A request whose Replica is not HeldOn did not get the
	// slot it waited for. HoldPromised is the prompt tokens the last
	// hold's slot shared with the request (affinity.HoldAdvice.Shared):
	// the reuse it waited for; HoldWait and HoldGain the seconds it was
	// predicted to wait and to save by waiting (affinity.HoldAdvice.Wait,
	// Gain). Empty when Holds is 0.
	Holds        int
	HeldOn       string
	HoldEnd      string
	HoldPromised int
	HoldWait     float64
	HoldGain     float64
}

// FirstBlock is Hashes[0], or 0 without a prompt (embeddings).
func (ev *RoutedEvent) FirstBlock() uint64 {
	if len(ev.Hashes) == 0 {
		return 0
	}
	return ev.Hashes[0]
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ev *RoutedEvent)

// ObserveRouted calls f(ev).
func (f ObserverFunc) ObserveRouted(ev *RoutedEvent) { f(ev) }

var _ Observer = ObserverFunc(nil)
