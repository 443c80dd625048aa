package affinity

// The Promoter's tracked clients: a fixed slab of records in LRU order,
// found by key through an open-addressing table allocated once.

// pclient is one tracked client. Fixed size: no per-client allocation.
type pclient struct {
	key        uint64
	prev, next int32
	n, pos     uint8     // ring fill and next write position
	promoted   ReplicaID // NoReplica when not promoted
	promotedAt int64
	lastSeen   int64
	demandAt   int64
	demand     float64 // decayed sum of (uncached + request cost) tokens
	cacheAvg   float64 // EWMA of cached tokens per request on the chosen replica
	ring       [maxPromoteWindow]pobs
	prefixes   [distinctSlots]seenKey
	sessions   [distinctSlots]seenKey
}

type pobs struct {
	replica        ReplicaID
	cached, prompt int32
	session        uint64
}

type seenKey struct {
	key uint64
	at  int64
}

// touch finds or creates the client's record and moves it to the LRU head.
func (p *Promoter) touch(key uint64, now int64) *pclient {
	if i := p.table.get(key); i >= 0 {
		c := &p.clients[i]
		p.unlink(i)
		p.pushHead(i)
		c.lastSeen = now
		return c
	}
	var i int32
	if len(p.clients) < p.cfg.MaxClients {
		p.clients = append(p.clients, pclient{})
		i = int32(len(p.clients) - 1)
	} else {
		i = p.tail
		old := &p.clients[i]
		if old.promoted != NoReplica {
			p.promoted--
		}
		p.table.del(old.key)
		p.unlink(i)
		p.st.Evictions++
	}
	p.clients[i] = pclient{key: key, promoted: NoReplica, lastSeen: now}
	p.table.insert(key, i)
	p.pushHead(i)
	return &p.clients[i]
}

func (p *Promoter) unlink(i int32) {
	c := &p.clients[i]
	if c.prev >= 0 {
		p.clients[c.prev].next = c.next
	} else {
		p.head = c.next
	}
	if c.next >= 0 {
		p.clients[c.next].prev = c.prev
	} else {
		p.tail = c.prev
	}
}

func (p *Promoter) pushHead(i int32) {
	c := &p.clients[i]
	c.prev, c.next = -1, p.head
	if p.head >= 0 {
		p.clients[p.head].prev = i
	} else {
		p.tail = i
	}
	p.head = i
}

// clientTable maps client keys to slab indices: open addressing, linear
// probing, backward-shift deletion, at most half full, allocated once.
type clientTable struct {
	keys []uint64 // 0 = empty (key 0 is stored as zeroKey)
	vals []int32
	mask uint64
}

const zeroKey = 0x9E3779B97F4A7C15

func newClientTable(entries int) clientTable {
	n := 16
	for n < 2*entries {
		n <<= 1
	}
	return clientTable{keys: make([]uint64, n), vals: make([]int32, n), mask: uint64(n - 1)}
}

func tkey(k uint64) uint64 {
	if k == 0 {
		return zeroKey
	}
	return k
}

func (t *clientTable) slot(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15 >> 17) & t.mask }

func (t *clientTable) get(k uint64) int32 {
	k = tkey(k)
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i] {
		case k:
			return t.vals[i]
		case 0:
			return -1
		}
	}
}

func (t *clientTable) insert(k uint64, v int32) {
	k = tkey(k)
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		if t.keys[i] == 0 || t.keys[i] == k {
			t.keys[i], t.vals[i] = k, v
			return
		}
	}
}

func (t *clientTable) del(k uint64) {
	k = tkey(k)
	i := t.slot(k)
	for ; t.keys[i] != k; i = (i + 1) & t.mask {
		if t.keys[i] == 0 {
			return
		}
	}
	for j := (i + 1) & t.mask; t.keys[j] != 0; j = (j + 1) & t.mask {
		home := t.slot(t.keys[j])
		if (j-home)&t.mask >= (j-i)&t.mask {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i] = 0
}
