package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/warmpath/warmpath/bpf"
)

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
		return nil, fmt.Errorf("adopt maps pinned at %s (from an incompatible version; remove them with fastpath.Uninstall / warmpath detach): %w", pin, err)
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
	// A new epoch with the new settings voids the ready headers built
	// under the old ones; the one after the flush below voids those built
	// meanwhile from next-hop entries the flush had not reached yet.
	cfg.FlowEpoch++
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
	// The ready headers are copies of next-hop entries: another epoch,
	// after the flush, voids them on every CPU.
	cfg.FlowEpoch++
	if err := k.objs.Settings.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("write settings: %w", err)
	}
	return nil
}

func (k *Kernel) lock() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return ErrClosed
	}
	return nil
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

var (
	_ Datapath = (*Kernel)(nil)
	_ Checker  = (*Kernel)(nil)
)
