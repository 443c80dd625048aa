package cluster

import (
	"net/netip"
	"time"

	"github.com/warmpath/warmpath/affinity"
)

// Batching: the affinity.PeerSink calls queue this instance's index and
// load changes, and loop flushes them as one batch per flush interval (or
// a heartbeat when there is nothing to say).

// PeerInsert implements affinity.PeerSink.
func (n *Node) PeerInsert(id affinity.ReplicaID, hashes []uint64) {
	if len(hashes) > n.maxChain {
		hashes = hashes[:n.maxChain] // a chain's prefix is still a chain
	}
	n.add(recInsert, id, 12+8*len(hashes), func(b []byte) []byte { return appendInsert(b, uint32(id), hashes) })
}

// PeerTruncate implements affinity.PeerSink.
func (n *Node) PeerTruncate(id affinity.ReplicaID, tail uint64, k int) {
	n.add(recTruncate, id, 24, func(b []byte) []byte { return appendTruncate(b, uint32(id), tail, k) })
}

// PeerTail implements affinity.PeerTailSink: a finished request's deepest
// block, for the continuation credit of its next turn on any instance.
func (n *Node) PeerTail(id affinity.ReplicaID, tail uint64) {
	n.add(recTail, id, 16, func(b []byte) []byte { return appendTail(b, uint32(id), tail) })
}

// PeerReset implements affinity.PeerSink.
func (n *Node) PeerReset(id affinity.ReplicaID) {
	n.add(recReset, id, 8, func(b []byte) []byte { return appendReset(b, uint32(id)) })
}

// PeerLoad implements affinity.PeerSink: values are absolute, so only the
// latest per replica is kept until the next flush.
func (n *Node) PeerLoad(id affinity.ReplicaID, l affinity.PeerLoad) {
	if id < 0 {
		return
	}
	n.mu.Lock()
	if int(id) >= len(n.loads) {
		n.grow(int(id))
	}
	n.loads[id] = l
	n.dirty[id] = true
	first := !n.armed
	n.armed = true
	n.mu.Unlock()
	if first {
		n.signal(n.arm)
	}
}

// PublishEntry shares a fast-path affinity entry this instance wrote
// (add: client steered to replica) or deleted (!add: replica may be
// NoReplica). It never blocks. Its signature is a steer.EntryHook.
func (n *Node) PublishEntry(client netip.Addr, replica affinity.ReplicaID, add bool) {
	k := byte(recEntryDel)
	if add {
		k = recEntryAdd
	} else {
		replica = max(replica, 0) // a deletion needs no replica
	}
	n.add(k, replica, 24, func(b []byte) []byte { return appendEntry(b, uint32(replica), client, add) })
}

// add appends one record (at most size bytes) to the pending batch, or
// drops it (counted) when NATS is down or the batch is full.
func (n *Node) add(kind byte, id affinity.ReplicaID, size int, enc func([]byte) []byte) {
	if id < 0 {
		return
	}
	if !n.connected.Load() {
		n.m.updDropped[dropDisconnected].Inc()
		return
	}
	n.mu.Lock()
	if len(n.pend)+size > n.cfg.MaxBatchBytes {
		n.mu.Unlock()
		n.m.updDropped[dropOverflow].Inc()
		n.kickFlush()
		return
	}
	n.pend = enc(n.pend)
	if int(id) >= len(n.used) {
		n.grow(int(id))
	}
	n.used[id] = true
	n.counts[kind]++
	half := len(n.pend) >= n.cfg.MaxBatchBytes/2
	first := !n.armed
	n.armed = true
	n.mu.Unlock()
	switch {
	case half:
		n.kickFlush()
	case first:
		n.signal(n.arm)
	}
}

// grow makes the per-replica slices hold id. Called with mu held.
func (n *Node) grow(id int) {
	k := max(id+1, 2*len(n.loads), 16)
	n.loads = append(n.loads, make([]affinity.PeerLoad, k-len(n.loads))...)
	n.dirty = append(n.dirty, make([]bool, k-len(n.dirty))...)
	n.used = append(n.used, make([]bool, k-len(n.used))...)
}

func (n *Node) kickFlush() { n.signal(n.kick) }

func (n *Node) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// loop flushes flush_interval after the first update of a batch (or at
// once when the batch is half full), heartbeats, times out silent peers
// and runs the warm-up when the connection comes up. An idle node wakes
// only for heartbeats.
func (n *Node) loop() {
	defer n.wg.Done()
	t := time.NewTimer(n.cfg.FlushInterval)
	t.Stop()
	defer t.Stop()
	var due <-chan time.Time // t.C while a flush is scheduled
	hb := time.NewTicker(n.cfg.Heartbeat)
	defer hb.Stop()
	warmed := n.cfg.SnapshotMaxBlocks < 0
	for {
		select {
		case <-n.closing:
			// The last batch: what is pending, flagged leaving.
			n.leaving = true
			n.flush(true)
			return
		case <-n.arm:
			if due == nil {
				t.Reset(n.cfg.FlushInterval)
				due = t.C
			}
		case <-due:
			due = nil
			n.flush(false)
		case <-n.kick:
			n.flush(false)
		case <-hb.C:
			if !n.connected.Load() {
				n.warnConnectErr()
			}
			n.refreshLoads()
			n.mu.Lock()
			n.allLoad = true
			n.mu.Unlock()
			n.flush(true)
		case <-n.warm:
			if !warmed {
				warmed = true
				n.wg.Add(1)
				go n.warmUp()
			}
		}
	}
}

// refreshLoads re-reads every replica's load from the Router for the
// heartbeat's full-load batch: concurrent requests' PeerLoad calls may have
// left a value one change old (affinity.PeerSink), and a replica removed
// since has none.
func (n *Node) refreshLoads() {
	n.mu.Lock()
	seen := append(n.seen[:0], make([]bool, len(n.loads))...)
	n.mu.Unlock()
	n.rt.LocalLoads(func(id affinity.ReplicaID, _ string, l affinity.PeerLoad) {
		n.mu.Lock()
		if int(id) >= len(n.loads) {
			n.grow(int(id))
		}
		if n.loads[id] != l {
			n.loads[id] = l
			n.dirty[id] = true
		}
		n.mu.Unlock()
		if int(id) < len(seen) {
			seen[id] = true
		}
	})
	n.mu.Lock()
	for id, ok := range seen {
		if !ok {
			n.loads[id] = affinity.PeerLoad{} // removed: no load, no record
			n.dirty[id] = false
		}
	}
	n.mu.Unlock()
	n.seen = seen
}

// expireLoop times out silent peers on its own ticker: a flusher stuck in
// a slow NATS write must not keep a departed peer's load.
func (n *Node) expireLoop() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.PeerTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case now := <-t.C:
			n.expirePeers(now)
		}
	}
}

// flush publishes the pending batch (heartbeat: even when empty).
func (n *Node) flush(heartbeat bool) {
	out, total := n.encodeBatch(heartbeat, time.Now().UnixNano())
	if out == nil {
		return
	}
	if !n.connected.Load() {
		n.seq-- // never published: not a gap for the peers
		n.m.updDropped[dropDisconnected].Add(float64(total))
		return
	}
	if err := n.nc.Publish(n.subjOut, out); err != nil {
		n.seq--
		n.m.batchDropped[dropPublish].Inc()
		n.m.updDropped[dropDisconnected].Add(float64(total))
		return
	}
	n.m.batchesSent.Inc()
	n.m.bytesSent.Add(float64(len(out)))
	for k, c := range n.sendCnt {
		if c > 0 {
			n.m.sent[k].Add(float64(c))
		}
	}
}

// encodeBatch takes the pending records (and the changed loads) and
// encodes them as one batch sent at sendNs; nil when there is nothing to
// send and heartbeat is false. total counts the updates in it. After a
// heartbeat or a reconnect (allLoad) the batch is a full-load one: every
// non-zero load, flagged so that receivers zero the rest. The result is
// valid until the next call (flusher goroutine only).
func (n *Node) encodeBatch(heartbeat bool, sendNs int64) (out []byte, total int) {
	n.mu.Lock()
	var flags byte
	if n.allLoad {
		flags |= flagFull
	}
	if n.leaving {
		flags |= flagLeave
	}
	for id := range n.dirty {
		if n.dirty[id] || (n.allLoad && n.loads[id] != (affinity.PeerLoad{})) {
			n.dirty[id] = false
			n.pend = appendLoad(n.pend, uint32(id), n.loads[id])
			n.used[id] = true
			n.counts[recLoad]++
		}
	}
	n.allLoad = false
	n.armed = false // the next update schedules the next flush
	if len(n.pend) == 0 && !heartbeat {
		n.mu.Unlock()
		return nil, 0
	}
	recs := n.pend
	n.pend, n.spare = n.spare[:0], recs
	n.sendCnt = n.counts
	n.counts = [recKinds]int{}
	n.sendUsed = append(n.sendUsed[:0], n.used...)
	clear(n.used)
	n.mu.Unlock()

	for _, c := range n.sendCnt {
		total += c
	}
	n.names = n.rt.ReplicaNames(n.names)
	n.seq++
	n.out = appendHeader(n.out[:0], msgBatch, flags, n.fp, n.inc, n.seq, sendNs, n.cfg.Instance)
	cnt := 0
	for id, u := range n.sendUsed {
		if u && id < len(n.names) && n.names[id] != "" {
			cnt++
		}
	}
	n.out = appendUvarint(n.out, uint64(cnt))
	for id, u := range n.sendUsed {
		if u && id < len(n.names) && n.names[id] != "" {
			n.out = appendTableEntry(n.out, uint32(id), n.names[id])
		}
	}
	n.out = append(n.out, recs...)
	return n.out, total
}
