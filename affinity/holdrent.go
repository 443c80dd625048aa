package affinity

import (
	"math"
	"sync"
)

// holdRents prices the copies slot holds forgo, as renting against
// buying. A request held for a busy slot whose request has computed the
// prompt prefix it wants (decoding) waits rather than compute another
// copy in a free slot, each time the better choice for that request (its
// hold's Gain: what computing the copy costs it more). But a prefix many
// requests want (one company's instructions, a system prompt) whose
// copies sit in busy slots keeps its requests waiting, while a copy in a
// slot that holds nothing they want, once computed, would serve the ones
// after: one request's extra time bought once against every later one's
// wait. Every such hold's predicted wait is rent charged to its prefix
// (Router.Hold); a new request's hold for it is declined once the rent
// has come to its gain (the buying price), and the rent starts again: as
// in the ski-rental problem, within the half-life's window no more waiting
// than about twice what buying at the right moment would have cost; a
// conversation's own history, a new prefix each turn, gathers no rent.
// Holds for a prompt still being computed are not charged: a copy
// computed beside them shares an engine with another cold prompt (the
// burst of requests carrying a prompt new to the fleet, which holds exist
// for).
//
// Rent decays with holdRentHalfLife: the demand a copy would serve is the
// recent one, and waits of long ago say little about what is held now
// (undecayed rent did worse on live llama.cpp's one-company bursts).
type holdRents struct {
	mu sync.Mutex
	e  [holdRentSlots]holdRent
}

// holdRent is one prefix's rent: seconds of predicted waiting, as of at.
type holdRent struct {
	key  uint64
	rent float64
	at   int64
}

const (
	holdRentSlots    = 64   // prefixes tracked at once (direct-mapped by hash)
	holdRentHalfLife = 10e9 // ns
)

// slot is key's entry, its rent decayed to now (reset if another prefix
// had the slot). mu held.
func (h *holdRents) slot(key uint64, now int64) *holdRent {
	e := &h.e[key%holdRentSlots]
	if e.key != key {
		*e = holdRent{key: key, at: now}
	}
	if dt := now - e.at; dt > 0 {
		e.rent *= math.Exp2(-float64(dt) / holdRentHalfLife)
		e.at = now
	}
	return e
}

// charge adds a hold's predicted wait (seconds) to key's rent.
func (h *holdRents) charge(key uint64, now int64, wait float64) {
	h.mu.Lock()
	h.slot(key, now).rent += wait
	h.mu.Unlock()
}

// paid says whether key's rent has come to price.
func (h *holdRents) paid(key uint64, now int64, price float64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.slot(key, now).rent >= price
}

// buy starts key's rent again: a request computes a copy.
func (h *holdRents) buy(key uint64, now int64) {
	h.mu.Lock()
	h.slot(key, now).rent = 0
	h.mu.Unlock()
}
