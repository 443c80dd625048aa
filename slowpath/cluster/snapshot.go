package cluster

import (
	"encoding/binary"
	"time"

	"github.com/nats-io/nats.go"
)

// Warm-up: a starting instance publishes a request on <prefix>.snapshot
// with a reply inbox; every peer answers with its index (ExportIndex, at
// most snapshot_max_blocks per replica) in chunks under max_batch_bytes,
// which the new instance imports (ImportIndex) as they arrive, for one
// peer_timeout. Routing never waits for it: it starts cold and improves
// when the chunks land.

func appendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

// warmUp asks the peers for their index and imports the answers until
// peer_timeout passes or the node closes.
func (n *Node) warmUp() {
	defer n.wg.Done()
	inbox := n.nc.NewRespInbox()
	sub, err := n.nc.Subscribe(inbox, n.onSnapshotChunk)
	if err != nil {
		n.log.Warn("warm-up: subscribe", "err", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	req := appendHeader(nil, msgBatch, 0, n.fp, n.inc, 0, time.Now().UnixNano(), n.cfg.Instance)
	req = appendUvarint(req, 0)
	if err := n.nc.PublishRequest(n.subjSnap, inbox, req); err != nil {
		n.log.Warn("warm-up: request", "err", err)
		return
	}
	n.log.Debug("warm-up: snapshot requested")
	t := time.NewTimer(n.cfg.PeerTimeout)
	defer t.Stop()
	select {
	case <-n.closing:
	case <-t.C:
	}
}

// onSnapshotChunk imports one chunk of a peer's snapshot.
func (n *Node) onSnapshotChunk(msg *nats.Msg) {
	if len(msg.Data) == 0 {
		return // the server's "no responders" status: no peer is up yet
	}
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	n.m.bytesReceived.Add(float64(len(msg.Data)))
	m := &n.snapMsg
	if err := Decode(msg.Data, m); err != nil || m.Kind != msgSnapshot {
		n.m.batchDropped[dropDecode].Inc()
		return
	}
	if m.Fingerprint != n.fp {
		n.m.batchDropped[dropMismatch].Inc()
		return
	}
	clear(n.snapLoc)
	for _, nm := range m.Names {
		if id, ok := n.rt.Lookup(nm.Name); ok {
			n.snapLoc[nm.ID] = id
		}
	}
	blocks := 0
	for i := range m.Records {
		r := &m.Records[i]
		id, ok := n.snapLoc[r.Replica]
		if !ok {
			n.m.updDropped[dropUnknown].Inc()
			continue
		}
		if err := n.rt.ImportIndex(id, r.Hashes, r.Parents); err == nil {
			blocks += len(r.Hashes)
			n.m.received[recSnapshot].Inc()
		}
	}
	n.m.snapshotImported.Add(float64(blocks))
}

// snapshotMinInterval spaces the snapshot answers of one node.
const snapshotMinInterval = time.Second

// onSnapshotRequest answers a peer's warm-up request with this instance's
// index, chunked under max_batch_bytes.
func (n *Node) onSnapshotRequest(msg *nats.Msg) {
	var m Message
	if err := Decode(msg.Data, &m); err != nil || msg.Reply == "" {
		n.m.batchDropped[dropDecode].Inc()
		return
	}
	if m.Instance == n.cfg.Instance || m.Fingerprint != n.fp || n.cfg.SnapshotMaxBlocks <= 0 {
		return
	}
	// A snapshot costs a walk of the index and up to snapshot_max_blocks
	// per replica on the wire: at most one answer per snapshotMinInterval,
	// whoever asks (a starting fleet asks each peer once).
	now := time.Now().UnixNano()
	if last := n.lastSnap.Load(); last != 0 && now-last < n.snapEvery.Load() {
		n.m.batchDropped[dropRateLimited].Inc()
		return
	}
	n.lastSnap.Store(now)
	chunks := n.exportChunks(now)
	blocks := 0
	for _, c := range chunks {
		if err := n.nc.Publish(msg.Reply, c.data); err != nil {
			n.m.batchDropped[dropPublish].Inc()
			return
		}
		n.m.bytesSent.Add(float64(len(c.data)))
		n.m.sent[recSnapshot].Add(float64(c.recs))
		blocks += c.blocks
	}
	n.m.snapshotSent.Add(float64(blocks))
	n.log.Debug("warm-up: snapshot sent", "peer", m.Instance, "chunks", len(chunks), "blocks", blocks)
}

type chunk struct {
	data         []byte
	recs, blocks int
}

// exportChunks encodes the Router's index as snapshot messages, each at
// most max_batch_bytes plus its header and table.
func (n *Node) exportChunks(now int64) []chunk {
	var (
		out   []chunk
		names []string
		recs  []byte
		cur   chunk
	)
	finish := func() {
		if len(recs) == 0 {
			return
		}
		b := appendHeader(nil, msgSnapshot, 0, n.fp, n.inc, uint64(len(out)), now, n.cfg.Instance)
		b = appendUvarint(b, uint64(len(names)))
		for i, nm := range names {
			b = appendTableEntry(b, uint32(i), nm)
		}
		cur.data = append(b, recs...)
		out = append(out, cur)
		cur, names, recs = chunk{}, names[:0], nil
	}
	n.rt.ExportIndex(n.cfg.SnapshotMaxBlocks, func(name string, hs, ps []uint64) {
		for len(hs) > 0 {
			k := min(len(hs), (n.cfg.MaxBatchBytes-len(recs)-32)/16)
			if k <= 0 {
				finish()
				continue
			}
			idx := -1
			for i, nm := range names {
				if nm == name {
					idx = i
				}
			}
			if idx < 0 {
				idx = len(names)
				names = append(names, name)
			}
			recs = appendSnapshot(recs, uint32(idx), hs[:k], ps[:k])
			cur.recs++
			cur.blocks += k
			hs, ps = hs[k:], ps[k:]
		}
	})
	finish()
	return out
}
