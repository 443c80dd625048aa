package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
	"github.com/warmpath/warmpath/fastpath/steer"
	"github.com/warmpath/warmpath/slowpath"
)

// fastpathFlags are serve's --fastpath-* flags; each given explicitly
// overrides the config file's `fastpath:` block.
type fastpathFlags struct {
	mode, iface, attach, vips, encap, pin *string
	sample                                *uint
	rebalance                             *time.Duration
}

func addFastpathFlags(fs *flag.FlagSet) *fastpathFlags {
	d := slowpath.DefaultFastpath()
	return &fastpathFlags{
		mode:      fs.String("fastpath-mode", d.Mode, "fast path: auto (XDP if possible, else userspace), kernel, userspace (config fastpath.mode)"),
		iface:     fs.String("fastpath-interface", "", "client-facing `interface` for XDP steering (fastpath.interface)"),
		attach:    fs.String("fastpath-attach", d.Attach, "XDP attach mode: auto, driver, generic (fastpath.attach)"),
		vips:      fs.String("fastpath-vip", "", "comma-separated VIP:port services; non-empty turns the fast path on (fastpath.services)"),
		encap:     fs.String("fastpath-encap-source", "", "outer IPv4 source of steered packets (fastpath.encap_source)"),
		pin:       fs.String("fastpath-pin-path", d.PinPath, "bpffs `dir` for pinned maps and links (fastpath.pin_path)"),
		sample:    fs.Uint("fastpath-sample-every", uint(d.SampleEvery), "send every Nth new connection of a promoted client to the slowpath (fastpath.sample_every)"),
		rebalance: fs.Duration("fastpath-rebalance-interval", d.RebalanceInterval, "control loop period (fastpath.rebalance_interval)"),
	}
}

// apply copies the flags given explicitly into f.
func (ff *fastpathFlags) apply(fs *flag.FlagSet, f *slowpath.FastpathConfig) {
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "fastpath-mode":
			f.Mode = *ff.mode
		case "fastpath-interface":
			f.Interface = *ff.iface
		case "fastpath-attach":
			f.Attach = *ff.attach
		case "fastpath-vip":
			f.Services = nil
			for _, s := range strings.Split(*ff.vips, ",") {
				if s = strings.TrimSpace(s); s != "" {
					f.Services = append(f.Services, s)
				}
			}
		case "fastpath-encap-source":
			f.EncapSource = *ff.encap
		case "fastpath-pin-path":
			f.PinPath = *ff.pin
		case "fastpath-sample-every":
			f.SampleEvery = uint32(*ff.sample)
		case "fastpath-rebalance-interval":
			f.RebalanceInterval = *ff.rebalance
		}
	})
}

// fastpathRun is an opened datapath and its control loop.
type fastpathRun struct {
	dp     fastpath.Datapath
	ctl    *steer.Controller
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// openFastpath opens the datapath for f (nil, nil when the fast path is
// off). In auto mode without BPF it returns the userspace datapath and
// fastpath.Open has logged one line with the reason.
func openFastpath(f *slowpath.FastpathConfig, probe func() error, log *slog.Logger) (fastpath.Datapath, error) {
	if !f.Enabled() {
		log.Info("fast path off: no fastpath.services configured, every connection goes through the slowpath (docs/deploy.md)")
		return nil, nil
	}
	mode, err := fastpath.ParseMode(f.Mode)
	if err != nil {
		return nil, err
	}
	opts := fastpath.Options{Mode: mode, Interface: f.Interface, Attach: fastpath.AttachMode(f.Attach),
		PinPath: f.PinPath, Probe: probe, Logger: log.With("component", "fastpath")}
	if f.EncapSource != "" {
		opts.EncapSource = netip.MustParseAddr(f.EncapSource) // validated
	}
	dp, err := fastpath.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	return dp, nil
}

// startFastpath registers the datapath's metrics, wires the controller as
// the server's Observer and starts its loop. Call before Serve.
func startFastpath(dp fastpath.Datapath, f *slowpath.FastpathConfig, srv *slowpath.Server, log *slog.Logger) (*fastpathRun, error) {
	if err := srv.Registry().Register(fastpath.NewCollector(dp)); err != nil {
		return nil, fmt.Errorf("fastpath metrics: %w", err)
	}
	ctl, err := steer.New(steer.Options{Datapath: dp, Source: steerSource{srv}, Services: f.ServiceAddrs(), SampleEvery: f.SampleEvery,
		Interval: f.RebalanceInterval, Promoter: f.Promoter, SignalMaxAge: srv.Config().Scrape.StaleAfter,
		Logger: log.With("component", "steer"), Registerer: srv.Registry()})
	if err != nil {
		return nil, err
	}
	srv.Observer = steerObserver{ctl}
	ctx, cancel := context.WithCancel(context.Background())
	fr := &fastpathRun{dp: dp, ctl: ctl, cancel: cancel}
	fr.wg.Add(1)
	go func() { defer fr.wg.Done(); ctl.Run(ctx) }()
	if dp.Mode() == fastpath.ModeKernel { // userspace: fastpath.Open logged its one line
		log.Info("fast path on", "mode", string(dp.Mode()), "interface", f.Interface, "services", strings.Join(f.Services, ","),
			"sample_every", f.SampleEvery)
	}
	return fr, nil
}

// steerSource adapts the slowpath to the control loop's steer.Source.
type steerSource struct{ srv *slowpath.Server }

func (s steerSource) Replicas() []steer.Replica {
	st := s.srv.Replicas()
	out := make([]steer.Replica, len(st))
	for i := range st {
		out[i] = steer.Replica{ID: st[i].ID, Host: st[i].Host, Healthy: st[i].Healthy}
	}
	return out
}

func (s steerSource) Router() *affinity.Router { return s.srv.Router() }
func (s steerSource) Now() int64               { return s.srv.Now() }

// steerObserver hands every proxied request to the control loop as a
// steer.Routed (copied on the stack: no allocation per request).
type steerObserver struct{ ctl *steer.Controller }

func (o steerObserver) ObserveRouted(ev *slowpath.RoutedEvent) {
	r := routedOf(ev)
	o.ctl.ObserveRouted(&r)
}

func routedOf(ev *slowpath.RoutedEvent) steer.Routed {
	return steer.Routed{Client: ev.Client, ReplicaID: ev.ReplicaID, FirstBlock: ev.FirstBlock(), SessionKey: ev.SessionKey,
		PromptTokens: ev.PromptTokens, PredictedCachedTokens: ev.PredictedCachedTokens, OK: ev.OK, End: ev.End}
}

var (
	_ steer.Source      = steerSource{}
	_ slowpath.Observer = steerObserver{}
)

// stop ends the control loop and closes the datapath. In kernel mode the
// program stays attached and the state pinned: steered connections keep
// flowing and the next warmpath adopts them (`warmpath detach` removes it).
func (fr *fastpathRun) stop() error {
	if fr == nil {
		return nil
	}
	fr.cancel()
	fr.wg.Wait()
	return fr.dp.Close()
}

func runStatus(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	pin := fs.String("pin-path", fastpath.DefaultPinPath, "bpffs `dir` of the pinned fast-path state")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if _, err := os.Stat(*pin); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(e.stdout, "fast path: no pinned state at %s: not installed, or warmpath runs in userspace mode (every connection goes through the slowpath)\n", *pin)
		return nil
	}
	// Kernel mode, no interface, no settings: adopt the pinned maps and
	// change nothing.
	dp, err := fastpath.Open(fastpath.Options{Mode: fastpath.ModeKernel, PinPath: *pin,
		Logger: slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if errors.Is(err, fastpath.ErrUnavailable) {
		fmt.Fprintf(e.stdout, "fast path: cannot read the kernel datapath here (%v): userspace mode\n", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	defer dp.Close()
	if err := fastpath.WriteStatus(e.stdout, dp); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

func runDetach(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("detach", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	pin := fs.String("pin-path", fastpath.DefaultPinPath, "bpffs `dir` of the pinned fast-path state")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := fastpath.Uninstall(*pin); err != nil {
		return fmt.Errorf("detach: %w", err)
	}
	fmt.Fprintf(e.stdout, "fast path detached, %s removed\n", *pin)
	return nil
}

// runDecap installs xdp_decap on a GPU host's edge-facing interface (or,
// with --detach, removes it) and exits: the program stays attached and its
// state pinned, no process needs to stay running.
func runDecap(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("decap", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	iface := fs.String("interface", "", "edge-facing `interface` (required unless --detach)")
	vips := fs.String("vip", "", "comma-separated VIP:port services to decapsulate (required unless --detach)")
	source := fs.String("source", "", "only decapsulate packets from this edge encap source (IPv4); empty: any")
	attach := fs.String("attach", "auto", "XDP attach mode: auto, driver, generic")
	pin := fs.String("pin-path", fastpath.DefaultDecapPinPath, "bpffs `dir` for the decap program's state")
	detach := fs.Bool("detach", false, "detach xdp_decap and remove the pinned state")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *detach {
		if err := fastpath.Uninstall(*pin); err != nil {
			return fmt.Errorf("decap: %w", err)
		}
		fmt.Fprintf(e.stdout, "decap detached, %s removed\n", *pin)
		return nil
	}
	var list []string
	for _, s := range strings.Split(*vips, ",") {
		if s = strings.TrimSpace(s); s != "" {
			list = append(list, s)
		}
	}
	if *iface == "" || len(list) == 0 {
		return errors.New("decap: --interface and --vip are required")
	}
	svcs, err := fastpath.ParseServices("--vip", list)
	mode, aerr := fastpath.ParseAttachMode("--attach", *attach)
	errs := []error{err, aerr}
	opts := fastpath.DecapOptions{Interface: *iface, Attach: mode, PinPath: *pin,
		Logger: slog.New(slog.NewTextHandler(e.stderr, nil))}
	if *source != "" {
		a, err := netip.ParseAddr(*source)
		if err != nil || !a.Is4() {
			errs = append(errs, &fastpath.FieldError{Field: "--source", Msg: fmt.Sprintf("must be an IPv4 address of the edge, got %q", *source)})
		}
		opts.Source = a
	}
	if *pin == "" || (*pin)[0] != '/' {
		errs = append(errs, &fastpath.FieldError{Field: "--pin-path", Msg: fmt.Sprintf("must be an absolute path on bpffs, got %q", *pin)})
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("decap: %w", err)
	}
	d, err := fastpath.OpenDecap(opts)
	if err != nil {
		return fmt.Errorf("decap: %w", err)
	}
	defer d.Close()
	if err := d.SetServices(svcs); err != nil {
		return fmt.Errorf("decap: %w", err)
	}
	fmt.Fprintf(e.stdout, "xdp_decap attached to %s for %s (state pinned in %s)\n", *iface, strings.Join(list, ","), *pin)
	return nil
}
