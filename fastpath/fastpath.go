package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Mode selects the datapath implementation.
type Mode string

const (
	// ModeAuto uses the kernel datapath when the probe succeeds and falls
	// back to userspace (with one log line giving the reason) when it
	// reports BPF as unavailable. The zero value means ModeAuto.
	ModeAuto Mode = "auto"
	// ModeKernel requires the XDP datapath; Open fails if it cannot work.
	ModeKernel Mode = "kernel"
	// ModeUserspace records intent only; every connection reaches the slowpath.
	ModeUserspace Mode = "userspace"
)

// ParseMode parses "auto", "kernel" or "userspace" ("" is auto).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeKernel, ModeUserspace:
		return Mode(s), nil
	}
	return "", fmt.Errorf("fastpath mode %q: want auto, kernel or userspace", s)
}

// AttachMode selects how the XDP program is attached.
type AttachMode string

const (
	// AttachAuto tries driver (native) mode and falls back to generic.
	AttachAuto AttachMode = "auto"
	// AttachDriver requires native XDP.
	AttachDriver AttachMode = "driver"
	// AttachGeneric uses generic (skb) XDP. It sees GRO-merged packets, so
	// large steered packets fail the MTU check: for tests and odd NICs only.
	AttachGeneric AttachMode = "generic"
)

// Limits of the datapath (they mirror bpf/warmpath.c).
const (
	MaxServices = 64
	MaxBackends = 256
	MaxAffinity = 65536
	MaxFlows    = 131072
)

// DefaultPinPath is where the edge pins its maps and links (on bpffs).
const DefaultPinPath = "/sys/fs/bpf/warmpath"

// DefaultNextHopTTL is the default Options.NextHopTTL.
const DefaultNextHopTTL = time.Second

// DefaultDecapPinPath is where a GPU host pins the decap program's state.
const DefaultDecapPinPath = "/sys/fs/bpf/warmpath-decap"

// Sentinel errors.
var (
	// ErrUnavailable: the kernel datapath cannot run here (not root, no BPF,
	// not Linux). The probe wraps it with the reason. In ModeAuto it selects
	// userspace mode; in ModeKernel it is returned from Open.
	ErrUnavailable = errors.New("kernel datapath unavailable")
	// ErrUnknownBackend: an affinity names a backend id not set by SetBackends.
	ErrUnknownBackend = errors.New("unknown backend")
	// ErrInvalid: an argument is out of range (the message names it).
	ErrInvalid = errors.New("invalid argument")
	// ErrFull: the affinity table is full; expire idle entries.
	ErrFull = errors.New("affinity table full")
	// ErrClosed: the Datapath was closed or detached.
	ErrClosed = errors.New("datapath closed")
)

// BackendID indexes a backend (a GPU host), 0 <= id < MaxBackends.
type BackendID uint32

// Service is a TCP VIP:port served by warmpath. Only IPv4 is steered.
type Service = netip.AddrPort

// Backend is one GPU host that steered connections can be sent to.
type Backend struct {
	ID BackendID
	// Addr is the host's IPv4 address: the outer destination of steered packets.
	Addr netip.Addr
	// Healthy backends take new steered connections. Established steered
	// connections keep flowing to an unhealthy backend.
	Healthy bool
	// Generation must equal an affinity entry's generation for the entry to
	// count; bump it when the host loses its cache (engine restart).
	Generation uint32
	// SampleEvery N > 0 sends every Nth affinity SYN (counted per CPU) to
	// the slowpath instead, so it keeps measuring the backend. 0 = never.
	SampleEvery uint32
}

// Affinity says: connections from Client to Service go to Backend, as long
// as the backend is healthy and still at Generation.
type Affinity struct {
	Client     netip.Addr
	Service    Service
	Backend    BackendID
	Generation uint32
}

// AffinityEntry is an Affinity as stored, with its idle time: the time
// since it last decided a connection (or was written).
type AffinityEntry struct {
	Affinity
	Idle time.Duration
}

// Counter is a packet and byte count.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// BackendCounters are the per-backend counters.
type BackendCounters struct {
	ID BackendID
	// Steered: packets/bytes sent to the backend.
	Steered Counter
	// SYN: new connections with a valid affinity to the backend.
	SYN Counter
	// Sampled: of those, sent to the slowpath by SampleEvery.
	Sampled Counter
}

// Counters is a snapshot summed over CPUs. Global is indexed by CounterKind.
// Backends lists backends with any non-zero counter, by id.
type Counters struct {
	Global   [NumCounterKinds]Counter
	Backends []BackendCounters
}

// Datapath is the fastpath API used by the slowpath and the control loop.
// Implementations are safe for concurrent use.
type Datapath interface {
	// Mode reports ModeKernel or ModeUserspace.
	Mode() Mode
	// SetServices replaces the set of services (IPv4 VIP:port, TCP). The
	// kernel datapath also deletes the flows of services no longer listed
	// (their established connections stop being steered).
	SetServices(svcs []Service) error
	// Services returns the current services, sorted.
	Services() ([]Service, error)
	// SetBackends replaces the set of backends; ids not listed are cleared.
	SetBackends(bs []Backend) error
	// Backends returns the current backends, by id.
	Backends() ([]Backend, error)
	// BumpGeneration increments a backend's generation, invalidating every
	// affinity entry written for the old one. Returns the new generation.
	BumpGeneration(id BackendID) (uint32, error)
	// SetAffinity inserts or replaces the affinity of (Client, Service);
	// its idle time restarts.
	SetAffinity(a Affinity) error
	// DeleteAffinity removes the affinity of (client, svc); no error if absent.
	DeleteAffinity(client netip.Addr, svc Service) error
	// LookupAffinity returns the entry of (client, svc), if any.
	LookupAffinity(client netip.Addr, svc Service) (AffinityEntry, bool, error)
	// RangeAffinity calls fn for each entry until fn returns false.
	RangeAffinity(fn func(AffinityEntry) bool) error
	// ExpireIdle deletes entries idle for at least maxIdle; returns how many.
	ExpireIdle(maxIdle time.Duration) (int, error)
	// Counters reads the counters.
	Counters() (Counters, error)
	// Close releases the process's handles. In kernel mode the program stays
	// attached and the maps stay pinned, so steered flows keep flowing and
	// the next Open adopts them.
	Close() error
	// Detach removes the program from the interface and unpins everything
	// (uninstall). The Datapath is closed afterwards.
	Detach() error
}

// Options configure Open. The zero value is auto mode without attaching.
type Options struct {
	// Mode: auto (default), kernel or userspace.
	Mode Mode
	// Interface is the client-facing interface to attach xdp_steer to.
	// Empty: load and pin the maps but attach nothing (tests, map-only use).
	// With Interface, EncapSource and NextHopTTL all zero, Open only adopts
	// the pinned state and leaves the settings alone: `warmpath status`.
	Interface string
	// Attach: auto (driver, then generic; default), driver or generic.
	Attach AttachMode
	// PinPath is a directory on a bpffs mount. Default DefaultPinPath.
	// Open mounts bpffs at PinPath's parent only if MountBPFFS is set.
	PinPath string
	// MountBPFFS mounts bpffs on PinPath's parent if it is not one already.
	MountBPFFS bool
	// EncapSource is the outer source address of steered packets. Invalid
	// (zero): the kernel picks the route's source (BPF_FIB_LOOKUP_SRC,
	// Linux >= 6.8).
	EncapSource netip.Addr
	// Logger; nil means slog.Default() with component=fastpath.
	Logger *slog.Logger
	// NextHopTTL is how long a per-CPU cached bpf_fib_lookup result (egress
	// interface, MACs, MTU) for a backend is used before the next lookup.
	// 0 means DefaultNextHopTTL; negative disables the cache (a lookup on
	// every steered packet, about 100 ns here). Route and neighbour changes
	// reach steered packets after at most this long.
	NextHopTTL time.Duration
	// Probe reports whether the kernel datapath can run; nil means the
	// default probe (run once per process). Tests inject failures here.
	Probe func() error
	// Now returns the monotonic clock in nanoseconds, the same clock as
	// bpf_ktime_get_coarse_ns (its tick-grained view). nil means
	// CLOCK_MONOTONIC (kernel and userspace).
	Now func() int64
}

// DecapOptions configure OpenDecap on a GPU host.
type DecapOptions struct {
	// Interface facing the edge; empty: load and pin, attach nothing.
	Interface string
	// Attach: auto (default), driver or generic.
	Attach AttachMode
	// PinPath on bpffs; default DefaultDecapPinPath.
	PinPath string
	// MountBPFFS mounts bpffs on PinPath's parent if needed.
	MountBPFFS bool
	// Source, when valid, restricts decapsulation to outer packets from this
	// address (the edge's encap source). Zero: any source.
	Source netip.Addr
	// Logger; nil means slog.Default() with component=fastpath.
	Logger *slog.Logger
}

func (o *Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default().With("component", "fastpath")
}

// Open returns the Datapath for opts.Mode. In ModeAuto a probe failure that
// wraps ErrUnavailable selects userspace mode and logs the reason once; any
// other probe error is returned. ModeKernel returns the probe's error.
func Open(opts Options) (Datapath, error) {
	mode, err := ParseMode(string(opts.Mode))
	if err != nil {
		return nil, err
	}
	log := opts.logger()
	if mode == ModeUserspace {
		log.Info("fastpath in userspace mode (forced): no in-kernel steering")
		return NewUserspace(opts.Now), nil
	}
	probe := opts.Probe
	if probe == nil {
		probe = Probe
	}
	if err := probe(); err != nil {
		if mode == ModeAuto && errors.Is(err, ErrUnavailable) {
			log.Warn("fastpath in userspace mode: no in-kernel steering", "reason", err.Error())
			return NewUserspace(opts.Now), nil
		}
		return nil, fmt.Errorf("fastpath kernel mode: %w", err)
	}
	dp, err := openKernel(opts, log)
	if err != nil && mode == ModeAuto && errors.Is(err, ErrUnavailable) {
		// Something the probe cannot see (bpffs not mounted, an attach
		// type): still a missing feature, still userspace.
		log.Warn("fastpath in userspace mode: no in-kernel steering", "reason", err.Error())
		return NewUserspace(opts.Now), nil
	}
	return dp, err
}

// validIPv4 reports an error naming field unless a is a valid IPv4 address.
func validIPv4(field string, a netip.Addr) error {
	if !a.Is4() {
		return fmt.Errorf("%s %v: want an IPv4 address: %w", field, a, ErrInvalid)
	}
	return nil
}

func validService(s Service) error {
	if !s.Addr().Is4() || s.Port() == 0 {
		return fmt.Errorf("service %v: want IPv4 VIP:port with port > 0: %w", s, ErrInvalid)
	}
	return nil
}

func validBackend(b Backend) error {
	if b.ID >= MaxBackends {
		return fmt.Errorf("backend id %d: want 0..%d: %w", b.ID, MaxBackends-1, ErrInvalid)
	}
	return validIPv4(fmt.Sprintf("backend %d addr", b.ID), b.Addr)
}

func validAffinity(a Affinity) error {
	if err := validIPv4("affinity client", a.Client); err != nil {
		return err
	}
	if err := validService(a.Service); err != nil {
		return err
	}
	if a.Backend >= MaxBackends {
		return fmt.Errorf("affinity backend %d: want 0..%d: %w", a.Backend, MaxBackends-1, ErrInvalid)
	}
	return nil
}
