package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/warmpath/warmpath/bpf"
)

func svcKey(s Service) bpf.WarmpathSvcKey {
	return bpf.WarmpathSvcKey{Vip: be32(s.Addr()), Port: be16(s.Port()), Proto: unix.IPPROTO_TCP}
}

// SetServices replaces the set of services.
func (k *Kernel) SetServices(svcs []Service) error {
	if err := checkServices(svcs); err != nil {
		return err
	}
	if err := k.lock(); err != nil {
		return err
	}
	defer k.mu.Unlock()
	old, err := readServices(k.objs.Services)
	if err != nil {
		return err
	}
	// The port filter first lets the new services' ports through, then
	// the services map changes, then the flows of removed services go
	// (a non-SYN packet follows its flow entry without the services map),
	// and last the filter drops ports no service has any more.
	if err := k.writeServicePorts(append(old, svcs...)); err != nil {
		return err
	}
	if err := setServices(k.objs.Services, svcs); err != nil {
		return err
	}
	gone := make(map[Service]bool)
	for _, s := range old {
		gone[s] = true
	}
	for _, s := range svcs {
		delete(gone, s)
	}
	if err := k.deleteFlows(gone); err != nil {
		return err
	}
	return k.writeServicePorts(svcs)
}

// writeServicePorts sets the svc_ports bitmap to exactly the ports of svcs.
func (k *Kernel) writeServicePorts(svcs []Service) error {
	const slots = 1024
	var bits [slots]uint64
	for _, s := range svcs {
		bits[s.Port()>>6] |= 1 << (s.Port() & 63)
	}
	keys := make([]uint32, slots)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := k.objs.SvcPorts.BatchUpdate(keys, bits[:], nil); err != nil {
		// Older kernels lack batch ops on arrays: one by one.
		for i := range bits {
			if err := k.objs.SvcPorts.Put(uint32(i), bits[i]); err != nil {
				return fmt.Errorf("write service ports: %w", err)
			}
		}
	}
	return nil
}

// deleteFlows removes the flow entries of the services in gone.
func (k *Kernel) deleteFlows(gone map[Service]bool) error {
	if len(gone) == 0 {
		return nil
	}
	var (
		key   bpf.WarmpathFlowKey
		val   bpf.WarmpathFlowVal
		stale []bpf.WarmpathFlowKey
	)
	it := k.objs.Flows.Iterate()
	for it.Next(&key, &val) {
		if gone[netip.AddrPortFrom(addrFrom(key.Daddr), port16(key.Dport))] {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read flows: %w", err)
	}
	for _, key := range stale {
		if err := k.objs.Flows.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete flow: %w", err)
		}
	}
	// The program's per-CPU flow caches may hold copies: a new epoch
	// voids them all.
	var cfg bpf.WarmpathConfig
	if err := k.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read settings: %w", err)
	}
	cfg.FlowEpoch++
	if err := k.objs.Settings.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

func setServices(m *ebpf.Map, svcs []Service) error {
	want := make(map[bpf.WarmpathSvcKey]bool, len(svcs))
	for _, s := range svcs {
		want[svcKey(s)] = true
	}
	var (
		key   bpf.WarmpathSvcKey
		val   bpf.WarmpathSvcVal
		stale []bpf.WarmpathSvcKey
	)
	it := m.Iterate()
	for it.Next(&key, &val) {
		if !want[key] {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read services: %w", err)
	}
	for _, key := range stale {
		if err := m.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete service: %w", err)
		}
	}
	for key := range want {
		if err := m.Put(&key, &bpf.WarmpathSvcVal{}); err != nil {
			return fmt.Errorf("write service %v: %w", serviceFromKey(key), err)
		}
	}
	return nil
}

func serviceFromKey(k bpf.WarmpathSvcKey) Service {
	return netip.AddrPortFrom(addrFrom(k.Vip), port16(k.Port))
}

// Services returns the services, sorted.
func (k *Kernel) Services() ([]Service, error) {
	if err := k.lock(); err != nil {
		return nil, err
	}
	defer k.mu.Unlock()
	return readServices(k.objs.Services)
}

func readServices(m *ebpf.Map) ([]Service, error) {
	var (
		key bpf.WarmpathSvcKey
		val bpf.WarmpathSvcVal
		out []Service
	)
	it := m.Iterate()
	for it.Next(&key, &val) {
		out = append(out, serviceFromKey(key))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read services: %w", err)
	}
	sortServices(out)
	return out, nil
}

// SetBackends replaces the set of backends.
func (k *Kernel) SetBackends(bs []Backend) error {
	if err := checkBackends(bs); err != nil {
		return err
	}
	if err := k.lock(); err != nil {
		return err
	}
	defer k.mu.Unlock()
	var slots [MaxBackends]bpf.WarmpathBackend
	for _, b := range bs {
		slots[b.ID] = backendValue(b)
	}
	keys := make([]uint32, MaxBackends)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := k.objs.Backends.BatchUpdate(keys, slots[:], nil); err != nil {
		// Older kernels lack batch ops on arrays: one by one.
		for i := range slots {
			if err := k.objs.Backends.Put(uint32(i), &slots[i]); err != nil {
				return fmt.Errorf("write backend %d: %w", i, err)
			}
		}
	}
	return nil
}

func backendValue(b Backend) bpf.WarmpathBackend {
	v := bpf.WarmpathBackend{Addr: be32(b.Addr), Gen: b.Generation, SampleEvery: b.SampleEvery}
	if b.Healthy {
		v.Healthy = 1
	}
	return v
}

// Backends returns the backends by id.
func (k *Kernel) Backends() ([]Backend, error) {
	if err := k.lock(); err != nil {
		return nil, err
	}
	defer k.mu.Unlock()
	var (
		key uint32
		val bpf.WarmpathBackend
		out []Backend
	)
	it := k.objs.Backends.Iterate()
	for it.Next(&key, &val) {
		if val.Addr == 0 {
			continue
		}
		out = append(out, Backend{ID: BackendID(key), Addr: addrFrom(val.Addr), Healthy: val.Healthy != 0,
			Generation: val.Gen, SampleEvery: val.SampleEvery})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read backends: %w", err)
	}
	return out, nil
}

func (k *Kernel) backend(id BackendID) (bpf.WarmpathBackend, error) {
	var v bpf.WarmpathBackend
	if id >= MaxBackends {
		return v, fmt.Errorf("backend id %d: want 0..%d: %w", id, MaxBackends-1, ErrInvalid)
	}
	if err := k.objs.Backends.Lookup(uint32(id), &v); err != nil {
		return v, fmt.Errorf("read backend %d: %w", id, err)
	}
	if v.Addr == 0 {
		return v, fmt.Errorf("backend %d: %w", id, ErrUnknownBackend)
	}
	return v, nil
}

// BumpGeneration increments the generation of backend id.
func (k *Kernel) BumpGeneration(id BackendID) (uint32, error) {
	if err := k.lock(); err != nil {
		return 0, err
	}
	defer k.mu.Unlock()
	v, err := k.backend(id)
	if err != nil {
		return 0, fmt.Errorf("bump generation: %w", err)
	}
	v.Gen++
	if err := k.objs.Backends.Put(uint32(id), &v); err != nil {
		return 0, fmt.Errorf("write backend %d: %w", id, err)
	}
	return v.Gen, nil
}

func affinityKey(client netip.Addr, svc Service) bpf.WarmpathAffKey {
	return bpf.WarmpathAffKey{Client: be32(client), Vip: be32(svc.Addr()), Port: be16(svc.Port())}
}

// SetAffinity inserts or replaces the affinity of (Client, Service).
func (k *Kernel) SetAffinity(a Affinity) error {
	if err := validAffinity(a); err != nil {
		return err
	}
	if err := k.lock(); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if _, err := k.backend(a.Backend); err != nil {
		return fmt.Errorf("set affinity: %w", err)
	}
	key := affinityKey(a.Client, a.Service)
	val := bpf.WarmpathAffVal{LastUsedNs: uint64(k.now()), Backend: uint32(a.Backend), Gen: a.Generation}
	if err := k.objs.Affinity.Put(&key, &val); err != nil {
		if errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("set affinity: %w", ErrFull)
		}
		return fmt.Errorf("set affinity: %w", err)
	}
	return nil
}

// DeleteAffinity removes the entry of (client, svc) if present.
func (k *Kernel) DeleteAffinity(client netip.Addr, svc Service) error {
	if err := k.lock(); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if !client.Is4() || !svc.Addr().Is4() {
		return nil
	}
	key := affinityKey(client, svc)
	if err := k.objs.Affinity.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete affinity: %w", err)
	}
	return nil
}

func affinityEntry(key bpf.WarmpathAffKey, val bpf.WarmpathAffVal, now int64) AffinityEntry {
	return AffinityEntry{
		Affinity: Affinity{
			Client:     addrFrom(key.Client),
			Service:    netip.AddrPortFrom(addrFrom(key.Vip), port16(key.Port)),
			Backend:    BackendID(val.Backend),
			Generation: val.Gen,
		},
		Idle: idle(now, int64(val.LastUsedNs)),
	}
}

// LookupAffinity returns the entry of (client, svc).
func (k *Kernel) LookupAffinity(client netip.Addr, svc Service) (AffinityEntry, bool, error) {
	if err := k.lock(); err != nil {
		return AffinityEntry{}, false, err
	}
	defer k.mu.Unlock()
	if !client.Is4() || !svc.Addr().Is4() {
		return AffinityEntry{}, false, nil
	}
	key := affinityKey(client, svc)
	var val bpf.WarmpathAffVal
	if err := k.objs.Affinity.Lookup(&key, &val); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return AffinityEntry{}, false, nil
		}
		return AffinityEntry{}, false, fmt.Errorf("lookup affinity: %w", err)
	}
	return affinityEntry(key, val, k.now()), true, nil
}

// RangeAffinity calls fn for each entry until fn returns false. Entries
// changed concurrently may be seen or not. fn may call other methods, but
// not RangeAffinity, Close, Detach or release (they wait for the range to
// end: a deadlock). A Fallback defers its release of a lost kernel side
// until no RangeAffinity runs, so through a Fallback fn may call anything
// but Close and Detach.
func (k *Kernel) RangeAffinity(fn func(AffinityEntry) bool) error {
	k.use.RLock()
	defer k.use.RUnlock()
	if err := k.lock(); err != nil {
		return err
	}
	m := k.objs.Affinity
	k.mu.Unlock()
	var (
		key bpf.WarmpathAffKey
		val bpf.WarmpathAffVal
	)
	now := k.now()
	it := m.Iterate()
	for it.Next(&key, &val) {
		if !fn(affinityEntry(key, val, now)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate affinity: %w", err)
	}
	return nil
}

// ExpireIdle deletes entries idle for at least maxIdle. An entry refreshed
// by the program between the scan and the delete is re-read and kept.
func (k *Kernel) ExpireIdle(maxIdle time.Duration) (int, error) {
	if err := k.lock(); err != nil {
		return 0, err
	}
	defer k.mu.Unlock()
	var (
		key   bpf.WarmpathAffKey
		val   bpf.WarmpathAffVal
		stale []bpf.WarmpathAffKey
	)
	now := k.now()
	it := k.objs.Affinity.Iterate()
	for it.Next(&key, &val) {
		if idle(now, int64(val.LastUsedNs)) >= maxIdle {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate affinity: %w", err)
	}
	n := 0
	for _, key := range stale {
		if err := k.objs.Affinity.Lookup(&key, &val); err != nil || idle(now, int64(val.LastUsedNs)) < maxIdle {
			continue
		}
		if err := k.objs.Affinity.Delete(&key); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete affinity: %w", err)
		}
	}
	return n, nil
}

// Counters reads the per-CPU counters and sums them.
func (k *Kernel) Counters() (Counters, error) {
	if err := k.lock(); err != nil {
		return Counters{}, err
	}
	// Under the lock: a concurrent Close or Detach (a Fallback giving the
	// kernel up mid-run) closes the map.
	defer k.mu.Unlock()
	return readCounters(k.objs.Counters, k.ncpu)
}

func readCounters(m *ebpf.Map, ncpu int) (Counters, error) {
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]bpf.WarmpathCounter, n*ncpu)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return Counters{}, fmt.Errorf("read counters: %w", err)
	}
	if got != n {
		// No batch support: one lookup per slot.
		per := make([]bpf.WarmpathCounter, ncpu)
		for i := range n {
			if err := m.Lookup(uint32(i), &per); err != nil {
				return Counters{}, fmt.Errorf("read counter %d: %w", i, err)
			}
			keys[i] = uint32(i)
			copy(vals[i*ncpu:], per)
		}
	}
	var c Counters
	sum := func(slot int) Counter {
		var s Counter
		for _, v := range vals[slot*ncpu : (slot+1)*ncpu] {
			s.Packets += v.Packets
			s.Bytes += v.Bytes
		}
		return s
	}
	for i := range NumCounterKinds {
		c.Global[i] = sum(int(i))
	}
	// The program counts a steered packet once, per backend (BE_STEERED,
	// which also counts steered_stack): the global steered is derived.
	var steered Counter
	for id := range MaxBackends {
		base := int(NumCounterKinds) + id*backendSlots
		if base+backendSlots > n {
			break
		}
		b := BackendCounters{ID: BackendID(id), Steered: sum(base + backendSteered), SYN: sum(base + backendSYN),
			Sampled: sum(base + backendSampled)}
		steered.Packets += b.Steered.Packets
		steered.Bytes += b.Steered.Bytes
		if b.Steered != (Counter{}) || b.SYN != (Counter{}) || b.Sampled != (Counter{}) {
			c.Backends = append(c.Backends, b)
		}
	}
	stack := c.Global[SteeredStack]
	c.Global[Steered].Packets += steered.Packets - min(stack.Packets, steered.Packets)
	c.Global[Steered].Bytes += steered.Bytes - min(stack.Bytes, steered.Bytes)
	return c, nil
}

// be32 returns a's bytes (network order) as a native uint32, the layout of
// a __be32 field in a Go copy of a C struct.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func addrFrom(u uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], u)
	return netip.AddrFrom4(b)
}

// be16 converts a host port to the native view of its network-order bytes.
func be16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func port16(u uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], u)
	return binary.BigEndian.Uint16(b[:])
}
