package cluster

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// UsageLedger is the per-tenant budget accounting a Node shares with its
// peers (slowpath's tenants: tenant.Ledger behind the router's clock), so
// a fleet enforces one budget per tenant rather than one per instance.
// Values are absolute (this instance's usage over the budget window and
// its requests in flight): a lost or reordered message is healed by the
// next, and a silent peer's values stop counting after the ledger's TTL.
type UsageLedger interface {
	// LocalUsage calls fn with this instance's usage per tenant: every
	// non-zero one when all is set (a heartbeat), else those changed since
	// the last call.
	LocalUsage(all bool, fn func(tenant string, in, out, inFlight int64))
	// SetPeerUsage records a peer's latest report for a tenant.
	SetPeerUsage(peer, tenant string, in, out, inFlight int64)
}

// Usage messages (kind msgUsage) travel on the batch subject
// <prefix>.u.<instance> with the batch header (their own sequence), an
// empty replica table, then until the end one record per tenant:
//
//	uvarint len + tenant name, uvarint in_tokens, out_tokens, in_flight
//
// A node that does not know the kind drops the message as undecodable and
// keeps applying batches: the batch format is unchanged.
const (
	msgUsage       = 3
	maxTenantBytes = 256
)

type usageState struct {
	ledger UsageLedger
	arm    chan struct{}
	seq    uint64 // flusher-only
	buf    []byte
	mu     sync.Mutex
	last   map[string]usagePeer // peer -> its last applied incarnation and sequence
	sent   prometheus.Counter
	recv   prometheus.Counter
}

type usagePeer struct{ inc, seq uint64 }

// startUsage starts sharing opts.Usage (Start, after the batch loop).
func (n *Node) startUsage(opts Options) error {
	if opts.Usage == nil {
		return nil
	}
	u := &n.usage
	u.ledger, u.arm, u.last = opts.Usage, make(chan struct{}, 1), map[string]usagePeer{}
	u.sent = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "cluster", Name: "usage_records_sent_total",
		Help: "Per-tenant budget usage records published (tenant budgets shared over the fleet)."})
	u.recv = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmpath", Subsystem: "cluster", Name: "usage_records_received_total",
		Help: "Per-tenant budget usage records applied from peers."})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{u.sent, u.recv} {
			if err := opts.Registerer.Register(c); err != nil {
				return err
			}
		}
	}
	n.wg.Add(1)
	go n.usageLoop()
	return nil
}

// KickUsage tells the node a tenant's usage changed: it is published
// within flush_interval (tenant.Ledger's OnChange). Non-blocking.
func (n *Node) KickUsage() {
	if n.usage.arm != nil {
		n.signal(n.usage.arm)
	}
}

// usageLoop publishes changed usage flush_interval after the first change
// and all of it every heartbeat.
func (n *Node) usageLoop() {
	defer n.wg.Done()
	t := time.NewTimer(n.cfg.FlushInterval)
	t.Stop()
	defer t.Stop()
	var due <-chan time.Time
	hb := time.NewTicker(n.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-n.closing:
			return
		case <-n.usage.arm:
			if due == nil {
				t.Reset(n.cfg.FlushInterval)
				due = t.C
			}
		case <-due:
			due = nil
			n.publishUsage(false)
		case <-hb.C:
			n.publishUsage(true)
		}
	}
}

// publishUsage sends the ledger's (changed or all) usage in messages of
// at most half of max_batch_bytes.
func (n *Node) publishUsage(all bool) {
	u := &n.usage
	if !n.connected.Load() {
		return // the ledger keeps what changed; a heartbeat sends it all
	}
	start := func() {
		u.seq++
		u.buf = appendHeader(u.buf[:0], msgUsage, 0, n.fp, n.inc, u.seq, time.Now().UnixNano(), n.cfg.Instance)
		u.buf = appendUvarint(u.buf, 0) // no replica table
	}
	empty := 0
	flush := func() {
		if len(u.buf) > empty {
			if err := n.nc.Publish(n.subjOut, u.buf); err != nil {
				n.m.batchDropped[dropPublish].Inc()
			}
		}
	}
	start()
	empty = len(u.buf)
	u.ledger.LocalUsage(all, func(tenant string, in, out, inFlight int64) {
		if len(tenant) > maxTenantBytes {
			return
		}
		if len(u.buf)+len(tenant)+32 > n.cfg.MaxBatchBytes/2 {
			flush()
			start()
		}
		u.buf = appendUvarint(u.buf, uint64(len(tenant)))
		u.buf = append(u.buf, tenant...)
		u.buf = appendUvarint(u.buf, uint64(max(in, 0)))
		u.buf = appendUvarint(u.buf, uint64(max(out, 0)))
		u.buf = appendUvarint(u.buf, uint64(max(inFlight, 0)))
		u.sent.Inc()
	})
	flush()
}

// isUsage reports whether b is a usage message (by its header).
func isUsage(b []byte) bool {
	return len(b) >= headerFixed && b[0] == 'W' && b[1] == 'P' && b[2] == 'C' && b[3] == wireVersion && b[4] == msgUsage
}

var errUsage = errors.New("decode: bad usage message")

// UsageRecord is one decoded usage record.
type UsageRecord struct {
	Tenant            string
	In, Out, InFlight int64
}

// DecodeUsage parses a usage message into m's header fields and the
// records (appended to recs[:0]). It never panics; allocation is bounded
// by len(b).
func DecodeUsage(b []byte, m *Message, recs []UsageRecord) ([]UsageRecord, error) {
	recs = recs[:0]
	if !isUsage(b) {
		return recs, errUsage
	}
	m.Kind, m.Flags = b[4], b[5]
	r := reader{b: b[6:]}
	m.Fingerprint, m.Incarnation, m.Seq = r.u64(), r.u64(), r.u64()
	m.SendNs = int64(r.u64())
	in := r.bytes(int(r.uvarint(maxInstance)))
	if r.err != nil {
		return recs, r.err
	}
	if len(in) == 0 {
		return recs, errInstance
	}
	m.Instance = string(in)
	if r.uvarint(0) != 0 || r.err != nil {
		return recs, errUsage
	}
	const maxVal = 1 << 62
	for r.err == nil && len(r.b) > 0 {
		name := r.bytes(int(r.uvarint(maxTenantBytes)))
		rec := UsageRecord{In: int64(r.uvarint(maxVal)), Out: int64(r.uvarint(maxVal)), InFlight: int64(r.uvarint(maxVal))}
		if r.err != nil {
			return recs, r.err
		}
		rec.Tenant = string(name)
		recs = append(recs, rec)
	}
	return recs, r.err
}

// applyUsage applies a peer's usage message received on subj ("": not
// checked) at now.
func (n *Node) applyUsage(subj string, b []byte, now time.Time) {
	u := &n.usage
	n.m.batchesReceived.Inc()
	n.m.bytesReceived.Add(float64(len(b)))
	if u.ledger == nil {
		return // budgets are not shared here
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	var m Message
	recs, err := DecodeUsage(b, &m, nil)
	if err != nil {
		n.m.batchDropped[dropDecode].Inc()
		return
	}
	switch {
	case subj != "" && subj != n.subjPfx+m.Instance:
		n.m.batchDropped[dropSubject].Inc()
		return
	case m.Instance == n.cfg.Instance, m.Fingerprint != n.fp:
		n.m.batchDropped[dropMismatch].Inc()
		return
	}
	if age := now.UnixNano() - m.SendNs; age > int64(n.cfg.MaxAge) || age < -int64(n.cfg.MaxAge) {
		n.m.batchDropped[dropStale].Inc()
		return
	}
	if p, ok := u.last[m.Instance]; ok && p.inc == m.Incarnation && m.Seq <= p.seq {
		return // older absolute values than those applied
	}
	if len(u.last) >= 4*maxPeersTracked && u.last[m.Instance] == (usagePeer{}) {
		clear(u.last) // bounded: forgetting only re-admits one late message per peer
	}
	u.last[m.Instance] = usagePeer{inc: m.Incarnation, seq: m.Seq}
	for _, r := range recs {
		u.ledger.SetPeerUsage(m.Instance, r.Tenant, r.In, r.Out, r.InFlight)
	}
	u.recv.Add(float64(len(recs)))
}

// maxPeersTracked bounds the usage sequence table (as the peer slots do).
const maxPeersTracked = 256

// onUsage is the subscription's handler for usage messages.
func (n *Node) onUsage(msg *nats.Msg) { n.applyUsage(msg.Subject, msg.Data, time.Now()) }
