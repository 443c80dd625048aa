package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/warmpath/warmpath/bpf"
)

type decapObjects struct {
	Decap    *ebpf.Program `ebpf:"xdp_decap"`
	Services *ebpf.Map     `ebpf:"services"`
	Settings *ebpf.Map     `ebpf:"settings"`
	Counters *ebpf.Map     `ebpf:"counters"`
}

// Decap is the GPU-host side: xdp_decap on the interface facing the edge
// strips the IPIP header of steered packets for the services and hands the
// inner packet to the stack (the VIP is configured on lo). Maps and the link
// are pinned under PinPath like the edge's.
type Decap struct {
	mu      sync.Mutex
	objs    decapObjects
	link    link.Link
	pinPath string
	ncpu    int
	closed  bool
}

// OpenDecap loads (or adopts) xdp_decap and attaches it to opts.Interface
// when set.
func OpenDecap(opts DecapOptions) (*Decap, error) {
	pin := opts.PinPath
	if pin == "" {
		pin = DefaultDecapPinPath
	}
	if err := ensurePinDir(pin, opts.MountBPFFS); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default().With("component", "fastpath")
	}
	spec, err := bpf.LoadWarmpath()
	if err != nil {
		return nil, fmt.Errorf("load bpf spec: %w", err)
	}
	d := &Decap{pinPath: pin}
	if d.ncpu, err = ebpf.PossibleCPU(); err != nil {
		return nil, fmt.Errorf("possible cpus: %w", err)
	}
	if err := spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pin}}); err != nil {
		return nil, fmt.Errorf("load xdp_decap: %w", err)
	}
	var cfg bpf.WarmpathConfig
	if opts.Source.IsValid() {
		if err := validIPv4("decap source", opts.Source); err != nil {
			d.closeObjs()
			return nil, err
		}
		cfg.DecapSrc = be32(opts.Source)
	}
	if opts.Interface != "" || opts.Source.IsValid() {
		if err := d.objs.Settings.Put(uint32(0), &cfg); err != nil {
			d.closeObjs()
			return nil, fmt.Errorf("write decap settings: %w", err)
		}
	}
	if opts.Interface != "" {
		l, _, err := attachXDP(log, d.objs.Decap, opts.Interface, opts.Attach, decapPinName(pin, opts.Interface))
		if err != nil {
			d.closeObjs()
			return nil, err
		}
		d.link = l
	}
	return d, nil
}

func decapPinName(pinPath, ifname string) string {
	return pinPath + "/link_xdp_decap_" + ifname
}

// SetServices replaces the services whose packets are decapsulated.
func (d *Decap) SetServices(svcs []Service) error {
	if err := checkServices(svcs); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	return setServices(d.objs.Services, svcs)
}

// Services returns the services, sorted.
func (d *Decap) Services() ([]Service, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	return readServices(d.objs.Services)
}

// Counters reads the counters (the Decap* kinds move on a GPU host).
func (d *Decap) Counters() (Counters, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Counters{}, ErrClosed
	}
	return readCounters(d.objs.Counters, d.ncpu)
}

func (d *Decap) closeObjs() {
	if d.link != nil {
		_ = d.link.Close()
		d.link = nil
	}
	_ = d.objs.Decap.Close()
	for _, m := range []*ebpf.Map{d.objs.Services, d.objs.Settings, d.objs.Counters} {
		_ = m.Close()
	}
}

// Close releases the handles; the pinned link keeps decapsulating.
func (d *Decap) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.closed = true
		d.closeObjs()
	}
	return nil
}

// Detach detaches every pinned xdp_decap link under PinPath, unpins the maps
// and removes PinPath.
func (d *Decap) Detach() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	var errs []error
	if d.link != nil {
		if err := d.link.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
	}
	errs = append(errs, detachPinnedLinks(d.pinPath, "link_xdp_decap_"))
	for _, m := range []*ebpf.Map{d.objs.Services, d.objs.Settings, d.objs.Counters} {
		if err := m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin map: %w", err))
		}
	}
	d.closed = true
	d.closeObjs()
	if err := os.Remove(d.pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove pin path: %w", err))
	}
	return errors.Join(errs...)
}
