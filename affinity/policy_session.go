package affinity

import (
	"slices"
	"sync"
)

// Session pins a session (Request.SessionKey: a session header or the
// OpenAI `user` field, hashed by the caller) to the replica its last request
// went to, for SessionTTL after that request. Unpinned requests, and pinned
// ones whose replica is not eligible, rank by least-request; the pinned
// replica, when eligible, is ranked first:
//
//	Ranked = [pin(SessionKey)] + LeastRequest's ranking without it
//
// pin(k) the replica k's last request began on, while younger than
// SessionTTL and not removed since.
type Session struct {
	ttl, max int64
	mu       sync.Mutex
	m        map[uint64]sessionEntry
	epoch    []uint32 // per ReplicaID, bumped on removal
}

// sweepPerBegin is how many session entries OnBegin examines for expiry.
const sweepPerBegin = 8

type sessionEntry struct {
	id      ReplicaID
	epoch   uint32
	expires int64
}

func newSession(cfg Config) *Session {
	return &Session{ttl: int64(cfg.SessionTTL), max: int64(cfg.MaxSessions), m: make(map[uint64]sessionEntry)}
}

func (*Session) Name() string { return "session" }

// Retune takes a new SessionTTL for pins made after it.
func (s *Session) Retune(cfg Config) {
	s.mu.Lock()
	s.ttl = int64(cfg.SessionTTL)
	s.mu.Unlock()
}

func (s *Session) Rank(v *View, req *Request, d *Decision) {
	pinned := NoReplica
	if req.SessionKey != 0 {
		s.mu.Lock()
		if e, ok := s.m[req.SessionKey]; ok && e.expires >= req.Now &&
			int(e.id) < len(s.epoch) && s.epoch[e.id] == e.epoch {
			pinned = e.id
		}
		s.mu.Unlock()
		if pinned != NoReplica && !slices.Contains(v.Candidates(), pinned) {
			pinned = NoReplica
		}
	}
	LeastRequest{}.Rank(v, req, d)
	if pinned == NoReplica {
		return
	}
	if i := slices.Index(d.Ranked, pinned); i >= 0 {
		copy(d.Ranked[1:i+1], d.Ranked[:i])
	} else {
		d.Ranked = append(d.Ranked[:min(len(d.Ranked), v.MaxRanked()-1)], NoReplica)
		copy(d.Ranked[1:], d.Ranked[:len(d.Ranked)-1])
	}
	d.Ranked[0] = pinned
}

// OnBegin pins req's session to id.
func (s *Session) OnBegin(id ReplicaID, req *Request) {
	if req.SessionKey == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for int(id) >= len(s.epoch) {
		s.epoch = append(s.epoch, 0)
	}
	// Incremental sweep: look at a few entries from a random map position
	// each time, so expired sessions never pile up (at most about
	// 1/sweepPerBegin of the table) and no call pays for a full scan.
	n := 0
	for k, e := range s.m {
		if e.expires < req.Now {
			delete(s.m, k)
		}
		if n++; n >= sweepPerBegin {
			break
		}
	}
	if _, ok := s.m[req.SessionKey]; !ok && int64(len(s.m)) >= s.max {
		return
	}
	s.m[req.SessionKey] = sessionEntry{id: id, epoch: s.epoch[id], expires: req.Now + s.ttl}
}

// OnRemove unpins every session on id.
func (s *Session) OnRemove(id ReplicaID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(id) < len(s.epoch) {
		s.epoch[id]++
	}
}

// Sessions is the number of pinned sessions (expired ones included until
// swept).
func (s *Session) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Interface guards.
var (
	_ Policy     = (*Session)(nil)
	_ BeginHook  = (*Session)(nil)
	_ RemoveHook = (*Session)(nil)
	_ Retuner    = (*Session)(nil)
)
