package steer

import "sync"

// connTable remembers, per client, the source ports of its recent
// slowpath connections, so that after promotion a request on a connection
// opened before it (not a sampled one) is not scaled up. Direct-mapped and
// fixed-size: a collision forgets a client's ports, which at worst counts
// one pre-promotion request as a sampled one.
type connTable struct {
	mu    sync.Mutex
	slots [4096]connSlot
}

type connSlot struct {
	key      uint64
	ports    [8]uint16 // recent connections, ring
	pos      uint8
	promoted bool
	pre      [8]uint16 // connections open when it was promoted
}

func (t *connTable) slot(key uint64) *connSlot {
	s := &t.slots[(key*0x9E3779B97F4A7C15)>>52]
	if s.key != key {
		*s = connSlot{key: key}
	}
	return s
}

// note records port for key; it reports whether the request must count as
// one (not promoted, or a connection that predates the promotion).
func (t *connTable) note(key uint64, port uint16) (pre bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.slot(key)
	known := false
	for _, p := range s.ports {
		known = known || p == port
	}
	if !known {
		s.ports[s.pos] = port
		s.pos = (s.pos + 1) % uint8(len(s.ports))
	}
	if !s.promoted {
		return true
	}
	for _, p := range s.pre {
		if p == port {
			return true
		}
	}
	return false
}

func (t *connTable) promote(key uint64) {
	t.mu.Lock()
	s := t.slot(key)
	s.promoted, s.pre = true, s.ports
	t.mu.Unlock()
}

func (t *connTable) demote(key uint64) {
	t.mu.Lock()
	if s := &t.slots[(key*0x9E3779B97F4A7C15)>>52]; s.key == key {
		s.promoted = false
	}
	t.mu.Unlock()
}
