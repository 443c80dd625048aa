package cluster

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/warmpath/warmpath/affinity"
)

// Applying peers' batches: sequence and incarnation checks, each record
// into the router's peer state, and peers that fall silent expired.

// expirePeers withdraws the load of peers silent for peer_timeout.
func (n *Node) expirePeers(now time.Time) {
	n.peerMu.Lock()
	defer n.peerMu.Unlock()
	for name, p := range n.peers {
		if now.Sub(p.lastSeen) > n.cfg.PeerTimeout {
			n.rt.ClearPeer(p.slot)
			n.slots[p.slot] = false
			delete(n.peers, name)
			n.log.Info("peer timed out: its load withdrawn", "peer", name, "silent", now.Sub(p.lastSeen).Round(time.Millisecond))
		}
	}
	n.m.peers.Set(float64(len(n.peers)))
}

// onBatch applies one peer's batch (the subscription goroutine).
func (n *Node) onBatch(msg *nats.Msg) {
	if isUsage(msg.Data) {
		n.onUsage(msg)
		return
	}
	n.apply(msg.Subject, msg.Data, time.Now())
}

// applyBatch decodes b and applies it; now is the receive time. It skips
// the subject check (tests, benchmarks: no subject).
func (n *Node) applyBatch(b []byte, now time.Time) { n.apply("", b, now) }

// apply decodes b, received on subject subj ("": not checked), and
// applies it; now is the receive time.
func (n *Node) apply(subj string, b []byte, now time.Time) {
	n.m.batchesReceived.Inc()
	n.m.bytesReceived.Add(float64(len(b)))
	m := &n.msg
	if err := Decode(b, m); err != nil || m.Kind != msgBatch {
		n.m.batchDropped[dropDecode].Inc()
		n.log.Debug("undecodable batch", "err", err)
		return
	}
	if subj != "" && (len(subj) != len(n.subjPfx)+len(m.Instance) || subj[:len(n.subjPfx)] != n.subjPfx || subj[len(n.subjPfx):] != m.Instance) {
		// Only <prefix>.u.<instance> speaks for instance: one publisher
		// must not fill the peer slots with made-up names.
		n.m.batchDropped[dropSubject].Inc()
		n.warnOnce("subject/"+subj, "batch published on a subject not its instance's: dropped", "subject", subj, "claims", m.Instance)
		return
	}
	if m.Instance == n.cfg.Instance {
		// NoEcho keeps our own batches away: another instance has our name.
		n.m.batchDropped[dropMismatch].Inc()
		n.warnOnce("dup/"+m.Instance, "another instance publishes under this instance name: its updates are ignored; cluster.instance must be unique", "peer", m.Instance)
		return
	}
	if m.Fingerprint != n.fp {
		n.m.batchDropped[dropMismatch].Inc()
		n.warnOnce("mismatch/"+m.Instance, "peer hashes prompts differently (hash.bytes_per_token, hash.block_tokens or tenancy differ): its updates are ignored", "peer", m.Instance)
		return
	}
	if age := now.UnixNano() - m.SendNs; age > int64(n.cfg.MaxAge) || age < -int64(n.cfg.MaxAge) {
		n.m.batchDropped[dropStale].Inc()
		n.warnOnce("stale/"+m.Instance, "peer's clock and ours differ by more than max_age (or its batches arrive that late): dropped", "peer", m.Instance, "age", time.Duration(age).Round(time.Millisecond))
		return
	}
	leave := m.Flags&flagLeave != 0
	n.peerMu.Lock()
	// peerMu is held while the batch is applied to the Router: Close,
	// expiry and a restart's ClearPeer never interleave with it (lock
	// order: peerMu, then the Router's).
	if n.closed {
		n.peerMu.Unlock()
		return
	}
	p := n.peers[m.Instance]
	if p == nil {
		if leave {
			n.peerMu.Unlock()
			return // nothing of it to withdraw
		}
		slot := -1
		for i := range n.slots {
			if !n.slots[i] {
				slot = i
				break
			}
		}
		if slot < 0 {
			n.peerMu.Unlock()
			n.warnOnce("slots/"+m.Instance, "too many peers: ignoring one", "peer", m.Instance, "max", affinity.MaxPeers)
			return
		}
		n.slots[slot] = true
		p = &peer{slot: slot, inc: m.Incarnation}
		n.peers[m.Instance] = p
		n.m.peers.Set(float64(len(n.peers)))
		n.log.Info("peer joined", "peer", m.Instance)
	}
	late := p.lastSeq != 0 && m.Seq <= p.lastSeq
	restart := p.inc != m.Incarnation
	switch {
	case restart:
	case late && p.lastSeq-m.Seq >= maxGap, !late && p.lastSeq != 0 && m.Seq-p.lastSeq-1 >= maxGap:
		// Sequences count from 1 per incarnation: a jump this large
		// either way is not reordering or loss (a forged or corrupted
		// batch): start over from this one rather than ignore the peer.
		restart = true
	case !late && p.lastSeq != 0 && m.Seq > p.lastSeq+1:
		n.m.batchDropped[dropGap].Add(float64(m.Seq - p.lastSeq - 1))
	}
	if restart {
		// A new process under the same name: its predecessor's load is
		// gone with it.
		n.rt.ClearPeer(p.slot)
		p.inc, late = m.Incarnation, false
		n.log.Info("peer restarted: its previous load withdrawn", "peer", m.Instance)
	}
	if !late {
		p.lastSeq = m.Seq
	}
	p.lastSeen = now
	slot := p.slot

	clear(n.local)
	for _, nm := range m.Names {
		if id, ok := n.rt.Lookup(nm.Name); ok {
			n.local[nm.ID] = id
		}
	}
	fn := n.entryFn.Load()
	n.ups, n.entries = n.ups[:0], n.entries[:0]
	var got [recKinds]int
	for i := range m.Records {
		r := &m.Records[i]
		id, ok := n.local[r.Replica]
		if !ok && r.Kind == recEntryAdd {
			// Steered to a replica this instance does not have: its
			// own entry for the client (if any) is stale all the same.
			id, ok, r.Kind = affinity.NoReplica, true, recEntryDel
		}
		if !ok && r.Kind == recEntryDel {
			id, ok = affinity.NoReplica, true // a deletion needs no replica
		}
		if !ok {
			n.m.updDropped[dropUnknown].Inc()
			continue
		}
		switch r.Kind {
		case recInsert:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindInsert, Replica: id, Hashes: r.Hashes})
		case recTruncate:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTruncate, Replica: id, Tail: r.Tail, N: r.N})
		case recReset:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindReset, Replica: id})
		case recTail:
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindTail, Replica: id, Tail: r.Tail})
		case recLoad:
			if late {
				continue // a newer absolute value was applied already
			}
			n.ups = append(n.ups, affinity.PeerUpdate{Kind: affinity.PeerKindLoad, Replica: id, Load: r.Load})
		case recEntryAdd, recEntryDel:
			if fn == nil {
				continue // nobody applies them
			}
			n.entries = append(n.entries, entryUp{client: r.Client, r: id, add: r.Kind == recEntryAdd})
		default:
			continue
		}
		got[r.Kind]++
	}
	if m.Flags&flagFull != 0 && !late {
		// The batch's loads are the peer's whole load: zero the rest
		// (a lost or reordered zero, a replica it removed).
		_ = n.rt.ReplacePeerLoads(slot, n.ups) // slot is in range by construction
	}
	if len(n.ups) > 0 {
		_ = n.rt.ApplyPeer(slot, n.ups)
	}
	if leave {
		n.rt.ClearPeer(slot)
		n.slots[slot] = false
		delete(n.peers, m.Instance)
		n.m.peers.Set(float64(len(n.peers)))
		n.log.Info("peer left: its load withdrawn", "peer", m.Instance)
	}
	n.peerMu.Unlock()
	if fn != nil {
		for _, e := range n.entries {
			(*fn)(e.client, e.r, e.add)
		}
	}
	for k, c := range got {
		if c > 0 {
			n.m.received[k].Add(float64(c))
		}
	}
	n.m.lag.Observe(max(float64(time.Now().UnixNano()-m.SendNs), 0) / 1e9)
}

func (n *Node) warnOnce(key, msg string, args ...any) {
	n.wMu.Lock()
	seen := n.warned[key]
	if !seen {
		if len(n.warned) >= 1024 {
			seen = true // full: stay quiet rather than warn on every batch
		} else {
			n.warned[key] = true
		}
	}
	n.wMu.Unlock()
	if !seen {
		n.log.Warn(msg, args...)
	}
}
