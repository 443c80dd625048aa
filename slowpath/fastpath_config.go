package slowpath

import (
	"errors"
	"net/netip"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/affinity"
)

// FastpathConfig is the `fastpath:` block: in-kernel steering of promoted
// clients. The fast path is on when Services lists at least one VIP:port;
// every other field then has a default. slowpath itself only validates it:
// cmd/warmpath opens the datapath (package fastpath) and runs the control
// loop (package fastpath/steer) from it.
type FastpathConfig struct {
	// Mode: "auto" (default: kernel XDP when BPF is usable, else userspace
	// with one log line), "kernel" (a failure to load or attach is fatal),
	// "userspace" (no BPF; every connection reaches the slowpath).
	Mode string `yaml:"mode"`
	// Interface is the edge's client-facing interface for xdp_steer.
	// Required unless Mode is userspace.
	Interface string `yaml:"interface"`
	// Attach: "auto" (default: native, then generic with a warning),
	// "driver" or "generic".
	Attach string `yaml:"attach"`
	// Services are the VIP:port addresses (IPv4, TCP) clients connect to;
	// the router listens on them (Listen should cover them) and the GPU
	// hosts' engines listen on them too. Empty: the fast path is off.
	Services []string `yaml:"services"`
	// EncapSource is the outer source address of steered (IPIP) packets,
	// an IPv4 address of the edge; GPU hosts' decap programs only accept
	// packets from it. Empty: the route's source (Linux >= 6.8).
	EncapSource string `yaml:"encap_source"`
	// PinPath is the bpffs directory of the pinned maps and links.
	// Default /sys/fs/bpf/warmpath.
	PinPath string `yaml:"pin_path"`
	// SampleEvery N sends every Nth new connection of a promoted client to
	// the slowpath anyway, which re-validates the entry. 0 = never
	// (entries then only change by rebalancing and expiry). Default 16.
	SampleEvery uint32 `yaml:"sample_every"`
	// RebalanceInterval is the control loop's period: backend health and
	// generations synced to the datapath, load-aware rebalancing, idle
	// expiry. Default 1s; [10ms, 1m].
	RebalanceInterval time.Duration `yaml:"rebalance_interval"`
	// Promoter holds the promotion rule's thresholds (affinity.PromoterConfig;
	// zero fields take its defaults: window 3, min_cached_fraction 0.5, ...).
	Promoter affinity.PromoterConfig `yaml:"promoter"`
}

// Fast-path modes and attach modes (the strings of package fastpath).
const (
	FastpathAuto      = "auto"
	FastpathKernel    = "kernel"
	FastpathUserspace = "userspace"
)

// DefaultFastpath returns the fast-path defaults (off: no services).
func DefaultFastpath() FastpathConfig {
	return FastpathConfig{
		Mode:              FastpathAuto,
		Attach:            "auto",
		PinPath:           "/sys/fs/bpf/warmpath",
		SampleEvery:       16,
		RebalanceInterval: time.Second,
	}
}

// Enabled reports whether the fast path is configured (a VIP is listed).
func (f *FastpathConfig) Enabled() bool { return len(f.Services) > 0 }

// ServiceAddrs parses Services (validated already).
func (f *FastpathConfig) ServiceAddrs() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(f.Services))
	for _, s := range f.Services {
		if a, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// Validate checks the block and returns every problem (an errors.Join);
// each error names the field and its range.
func (f *FastpathConfig) Validate() error {
	var v fieldErrs
	switch f.Mode {
	case FastpathAuto, FastpathKernel, FastpathUserspace:
	default:
		v.addf("fastpath.mode", "must be %q, %q or %q, got %q", FastpathAuto, FastpathKernel, FastpathUserspace, f.Mode)
	}
	switch f.Attach {
	case "auto", "driver", "generic":
	default:
		v.addf("fastpath.attach", "must be \"auto\", \"driver\" or \"generic\", got %q", f.Attach)
	}
	seen := map[netip.AddrPort]int{}
	for i, s := range f.Services {
		field := "fastpath.services[" + strconv.Itoa(i) + "]"
		a, err := netip.ParseAddrPort(s)
		if err != nil || !a.Addr().Is4() || a.Port() == 0 {
			v.addf(field, "must be an IPv4 VIP:port with port > 0, got %q", s)
			continue
		}
		if j, dup := seen[a]; dup {
			v.addf(field, "%q duplicates fastpath.services[%d]", s, j)
			continue
		}
		seen[a] = i
	}
	if len(f.Services) > 64 {
		v.addf("fastpath.services", "at most 64, got %d", len(f.Services))
	}
	if f.EncapSource != "" {
		if a, err := netip.ParseAddr(f.EncapSource); err != nil || !a.Is4() {
			v.addf("fastpath.encap_source", "must be an IPv4 address of the edge, got %q", f.EncapSource)
		}
	}
	if f.Enabled() && f.Mode != FastpathUserspace && f.Interface == "" {
		v.addf("fastpath.interface", "required (the client-facing interface for XDP) when fastpath.services is set and mode is %q", f.Mode)
	}
	if f.PinPath == "" || f.PinPath[0] != '/' {
		v.addf("fastpath.pin_path", "must be an absolute path on bpffs, got %q", f.PinPath)
	}
	if f.RebalanceInterval < 10*time.Millisecond || f.RebalanceInterval > time.Minute {
		v.addf("fastpath.rebalance_interval", "must be in [10ms, 1m], got %s", f.RebalanceInterval)
	}
	v.addPrefixed("fastpath.promoter.", f.Promoter.Validate())
	return errors.Join(v...)
}

// replicaHost returns the fast-path host of a replica: Host, else the
// IPv4 literal of Address's host, else invalid.
func replicaHost(rc *ReplicaConfig) netip.Addr {
	if rc.Host != "" {
		if a, err := netip.ParseAddr(rc.Host); err == nil && a.Is4() {
			return a
		}
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(rc.Address); err == nil && ap.Addr().Unmap().Is4() {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
