package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/warmpath/warmpath/bpf"
)

const backendLocal = 0xffffffff

// edgeObjects is what the edge loads: the steering program and every map.
type edgeObjects struct {
	Steer *ebpf.Program `ebpf:"xdp_steer"`
	bpf.WarmpathMaps
}

// Kernel is the XDP Datapath. Maps are pinned under PinPath, so a restarted
// process adopts the state; the XDP link is pinned too, so steering keeps
// running while no process holds it.
type Kernel struct {
	mu sync.Mutex
	// use is held (read) by RangeAffinity while it iterates outside mu,
	// and (write) by Close and Detach, so the maps are not closed under it.
	use     sync.RWMutex
	log     *slog.Logger
	objs    edgeObjects
	link    link.Link
	ifname  string // the interface link is attached to
	ifindex int
	pinPath string
	now     func() int64
	ncpu    int
	closed  bool
}

// openKernel opens the kernel datapath wrapped in a Fallback: losing it
// mid-run turns it into a userspace datapath instead of failing.
func openKernel(opts Options, log *slog.Logger) (Datapath, error) {
	k, err := OpenKernel(opts)
	if err != nil {
		return nil, err
	}
	return NewFallback(k, opts.Now, log), nil
}

// OpenKernel loads (or adopts) the kernel datapath without probing: Open is
// the usual entry point. It pins maps under opts.PinPath and, when
// opts.Interface is set, attaches xdp_steer to it (or adopts and updates the
// link pinned for that interface).
func OpenKernel(opts Options) (*Kernel, error) {
	pin := opts.PinPath
	if pin == "" {
		pin = DefaultPinPath
	}
	if err := ensurePinDir(pin, opts.MountBPFFS); err != nil {
		return nil, err
	}
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	k := &Kernel{log: opts.logger(), pinPath: pin, now: opts.Now}
	if k.now == nil {
		k.now = monoNow
	}
	if k.ncpu, err = ebpf.PossibleCPU(); err != nil {
		return nil, fmt.Errorf("possible cpus: %w", err)
	}
	err = spec.LoadAndAssign(&k.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pin}})
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("adopt maps pinned at %s (from an incompatible version; remove them with fastpath.Uninstall / warmpath --detach): %w", pin, err)
	}
	if err != nil {
		return nil, unsupported(fmt.Errorf("load xdp_steer: %w", err))
	}
	// The port filter is this program's own (not pinned): rebuild it from
	// the (possibly adopted) services before the program can be attached.
	if svcs, err := readServices(k.objs.Services); err != nil {
		k.closeObjs()
		return nil, err
	} else if err := k.writeServicePorts(svcs); err != nil {
		k.closeObjs()
		return nil, err
	}
	if opts.EncapSource.IsValid() {
		if err := validIPv4("encap source", opts.EncapSource); err != nil {
			k.closeObjs()
			return nil, err
		}
	}
	// A process that only reads (warmpath status: no Interface, no
	// settings) must not reset what the running instance configured.
	if opts.Interface != "" || opts.EncapSource.IsValid() || opts.NextHopTTL != 0 {
		ttl := opts.NextHopTTL
		switch {
		case ttl == 0:
			ttl = DefaultNextHopTTL
		case ttl < 0:
			ttl = 0
		}
		if err := k.setSettings(opts.EncapSource, ttl); err != nil {
			k.closeObjs()
			return nil, err
		}
	}
	if opts.Interface != "" {
		if err := k.attach(opts.Interface, opts.Attach); err != nil {
			k.closeObjs()
			return nil, unsupported(err)
		}
	}
	return k, nil
}

// unsupported marks err as ErrUnavailable when the kernel lacks a feature
// (ebpf.ErrNotSupported: a helper, map or attach type the probe could not
// see), so auto mode falls back instead of exiting.
func unsupported(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// ensurePinDir creates dir (mode 0700) on a bpffs mount, mounting bpffs on
// its parent first if asked to; an existing dir open to group or others is
// chmod'ed to 0700, a symlink or non-directory is refused.
func ensurePinDir(dir string, mount bool) error {
	parent := filepath.Dir(dir)
	if !isBPFFS(parent) {
		if !mount {
			// A missing kernel feature like any other: auto mode falls back.
			return fmt.Errorf("%w: pin path %s: %s is not a bpffs mount (mount -t bpf bpf %s)", ErrUnavailable, dir, parent, parent)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", parent, err)
		}
		if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("%w: mount bpffs on %s: %w", ErrUnavailable, parent, err)
			}
			return fmt.Errorf("mount bpffs on %s: %w", parent, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin path: %w", err)
	}
	// The pinned maps steer traffic: an existing directory that others
	// could write (or that is not a directory) is tightened or refused.
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("pin path: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("pin path %s is not a directory (mode %v)", dir, fi.Mode())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("pin path %s is accessible to others (mode %v) and chmod 0700 failed: %w", dir, fi.Mode().Perm(), err)
		}
	}
	return nil
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

func linkPinName(pinPath, ifname string) string {
	return filepath.Join(pinPath, "link_xdp_steer_"+ifname)
}

// attach attaches xdp_steer to ifname, or adopts the link pinned for it and
// atomically replaces its program with the one just loaded.
func (k *Kernel) attach(ifname string, mode AttachMode) error {
	l, ifindex, err := attachXDP(k.log, k.objs.Steer, ifname, mode, linkPinName(k.pinPath, ifname))
	if err != nil {
		return err
	}
	k.link, k.ifname, k.ifindex = l, ifname, ifindex
	return nil
}

// Check reports ErrLost when xdp_steer is no longer attached to its
// interface: the link was detached (`warmpath detach`, `bpftool link
// detach`) or the interface was deleted. Without an interface there is
// nothing to lose. One BPF_OBJ_GET_INFO_BY_FD call; when that call fails
// the answer is unknown: Check returns its error, not ErrLost.
func (k *Kernel) Check() error {
	if err := k.lock(); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if k.link == nil {
		return nil
	}
	on, err := pinnedOn(k.link)
	if err != nil {
		return fmt.Errorf("check xdp link of %s: %w", k.ifname, err)
	}
	if on == 0 || on != k.ifindex {
		return fmt.Errorf("%w: xdp_steer is no longer attached to %s (detached, or the interface is gone)", ErrLost, k.ifname)
	}
	return nil
}

// attachXDP returns the link and the ifindex it is attached to.
func attachXDP(log *slog.Logger, prog *ebpf.Program, ifname string, mode AttachMode, pinName string) (link.Link, int, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, 0, fmt.Errorf("attach xdp to %s: %w", ifname, err)
	}
	if l, err := link.LoadPinnedLink(pinName, nil); err == nil {
		on, err := pinnedOn(l)
		if err != nil {
			_ = l.Close()
			return nil, 0, fmt.Errorf("pinned xdp link %s: %w", pinName, err)
		}
		if on == iface.Index {
			if err := l.Update(prog); err != nil {
				_ = l.Close()
				return nil, 0, fmt.Errorf("update pinned xdp link %s: %w", pinName, err)
			}
			log.Info("adopted pinned xdp link", "interface", ifname, "pin", pinName)
			return l, iface.Index, nil
		}
		// The interface was recreated (or the link detached): start afresh.
		log.Warn("pinned xdp link no longer attached to the interface, re-attaching", "interface", ifname, "pin", pinName)
		_ = l.Unpin()
		_ = l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("load pinned xdp link %s: %w", pinName, err)
	}
	var flags []link.XDPAttachFlags
	switch mode {
	case "", AttachAuto:
		flags = []link.XDPAttachFlags{link.XDPDriverMode, link.XDPGenericMode}
	case AttachDriver:
		flags = []link.XDPAttachFlags{link.XDPDriverMode}
	case AttachGeneric:
		flags = []link.XDPAttachFlags{link.XDPGenericMode}
	default:
		return nil, 0, fmt.Errorf("attach mode %q: want auto, driver or generic: %w", mode, ErrInvalid)
	}
	var l link.Link
	for i, f := range flags {
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: iface.Index, Flags: f})
		if err == nil {
			if i > 0 {
				log.Warn("xdp driver mode unavailable, attached in generic mode", "interface", ifname)
			}
			break
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("attach xdp to %s (%s mode): %w", ifname, mode, err)
	}
	if err := l.Pin(pinName); err != nil {
		_ = l.Close()
		return nil, 0, fmt.Errorf("pin xdp link of %s: %w", ifname, err)
	}
	return l, iface.Index, nil
}

// pinnedOn returns the ifindex an XDP link is attached to, 0 if none; an
// error when the kernel could not say (BPF_OBJ_GET_INFO_BY_FD failed).
func pinnedOn(l link.Link) (int, error) {
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("link info: %w", err)
	}
	if info.XDP() == nil {
		return 0, nil
	}
	return int(info.XDP().Ifindex), nil
}

// Mode returns ModeKernel.
func (k *Kernel) Mode() Mode { return ModeKernel }

// setSettings writes the encap source (invalid: the route's) and the
// next-hop cache lifetime (0: no cache).
func (k *Kernel) setSettings(a netip.Addr, nhTTL time.Duration) error {
	var cfg bpf.WarmpathConfig
	if err := k.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read settings: %w", err)
	}
	cfg.EncapSrc = 0
	if a.IsValid() {
		cfg.EncapSrc = be32(a)
	}
	cfg.NhTtlNs = uint64(nhTTL)
	if err := k.objs.Settings.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	// Entries filled under the old settings must not outlive them.
	per := make([]bpf.WarmpathNexthop, k.ncpu)
	for i := range uint32(MaxBackends) {
		if err := k.objs.Nexthops.Put(i, per); err != nil {
			return fmt.Errorf("flush next-hop cache: %w", err)
		}
	}
	return nil
}

func svcKey(s Service) bpf.WarmpathSvcKey {
	return bpf.WarmpathSvcKey{Vip: be32(s.Addr()), Port: be16(s.Port()), Proto: unix.IPPROTO_TCP}
}

func (k *Kernel) lock() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return ErrClosed
	}
	return nil
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
		b := BackendCounters{ID: BackendID(id), Steered: sum(base), SYN: sum(base + 1), Sampled: sum(base + 2)}
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

func (k *Kernel) closeObjs() {
	if k.link != nil {
		_ = k.link.Close()
		k.link = nil
	}
	_ = k.objs.Steer.Close()
	_ = k.objs.WarmpathMaps.Close()
}

// Close releases this process's handles; the pinned link keeps the program
// attached and the pinned maps keep the state.
func (k *Kernel) Close() error {
	k.use.Lock()
	defer k.use.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	k.closeObjs()
	return nil
}

// Detach detaches every xdp_steer link pinned under PinPath (whatever the
// interface), unpins the maps and removes PinPath. Established steered flows
// stop being steered.
func (k *Kernel) Detach() error {
	k.use.Lock()
	defer k.use.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	var errs []error
	if k.link != nil {
		if err := k.link.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
	}
	errs = append(errs, detachPinnedLinks(k.pinPath, "link_xdp_steer_"))
	for _, pm := range k.pinnedMaps() {
		if err := pm.m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin map: %w", err))
		}
	}
	k.closed = true
	k.closeObjs()
	if err := os.Remove(k.pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		k.log.Info("pin path not removed", "path", k.pinPath, "err", err)
	}
	return errors.Join(errs...)
}

// pinnedMaps are the maps the edge pins under PinPath, by pin name.
func (k *Kernel) pinnedMaps() []struct {
	name string
	m    *ebpf.Map
} {
	return []struct {
		name string
		m    *ebpf.Map
	}{{"services", k.objs.Services}, {"affinity", k.objs.Affinity}, {"backends", k.objs.Backends},
		{"flows", k.objs.Flows}, {"settings", k.objs.Settings}, {"counters", k.objs.Counters}}
}

// release gives up this process's kernel side after it was lost: it
// detaches its own XDP link (BPF_LINK_DETACH on its own handle, whatever
// is attached elsewhere), unpins a pinned object only when it still is this
// process's one (same link or map id: another instance may have pinned its
// own at the same path since), leaves the maps pinned while any other XDP
// link is pinned under PinPath (an instance that adopted them), and closes
// the handles. Unlike Detach it never touches another instance's state.
func (k *Kernel) release() error {
	k.use.Lock()
	defer k.use.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	var errs []error
	if k.link != nil {
		// Already detached when the link was lost: ENOLINK is expected.
		_ = k.link.Detach()
		if info, err := k.link.Info(); err == nil {
			p := linkPinName(k.pinPath, k.ifname)
			if l, err := link.LoadPinnedLink(p, nil); err == nil {
				if pi, err := l.Info(); err == nil && pi.ID == info.ID {
					if err := l.Unpin(); err != nil {
						errs = append(errs, fmt.Errorf("unpin own link: %w", err))
					}
				}
				_ = l.Close()
			}
		}
	}
	ents, _ := os.ReadDir(k.pinPath)
	shared := false
	for _, e := range ents {
		shared = shared || strings.HasPrefix(e.Name(), "link_xdp_")
	}
	if !shared {
		for _, pm := range k.pinnedMaps() {
			if err := unpinIfSame(pm.m, filepath.Join(k.pinPath, pm.name)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	k.closed = true
	k.closeObjs()
	_ = os.Remove(k.pinPath) // only when empty: anything left is someone else's
	return errors.Join(errs...)
}

// unpinIfSame removes the pin at path when it is m.
func unpinIfSame(m *ebpf.Map, path string) error {
	mi, err := m.Info()
	if err != nil {
		return fmt.Errorf("map info: %w", err)
	}
	id, ok := mi.ID()
	if !ok {
		return nil // cannot tell: leave it
	}
	pm, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil // gone, or not ours to judge
	}
	defer pm.Close()
	pi, err := pm.Info()
	if err != nil {
		return fmt.Errorf("pinned map info %s: %w", path, err)
	}
	if pid, ok := pi.ID(); !ok || pid != id {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin map %s: %w", path, err)
	}
	return nil
}

// detachPinnedLinks detaches, unpins and closes every link pinned in dir
// whose name starts with prefix. The explicit detach (BPF_LINK_DETACH)
// takes the program off its interface even while a running warmpath holds
// the link open (that process then falls back to userspace mode).
func detachPinnedLinks(dir, prefix string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read pin path: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned link %s: %w", p, err))
			continue
		}
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", p, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
		}
		_ = l.Close()
	}
	return errors.Join(errs...)
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

var (
	_ Datapath = (*Kernel)(nil)
	_ Checker  = (*Kernel)(nil)
)

// Uninstall detaches every warmpath XDP link pinned under pinPath (edge or
// decap) and removes every pinned map and the directory, without loading
// anything: it works when the pinned maps are from an incompatible version.
// A missing pinPath is not an error.
func Uninstall(pinPath string) error {
	if pinPath == "" {
		pinPath = DefaultPinPath
	}
	errs := []error{detachPinnedLinks(pinPath, "link_xdp_")}
	ents, err := os.ReadDir(pinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uninstall: %w", err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(pinPath, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("uninstall: %w", err))
		}
	}
	if err := os.Remove(pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("uninstall: %w", err))
	}
	return errors.Join(errs...)
}
