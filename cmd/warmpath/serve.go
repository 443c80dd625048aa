package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warmpath/warmpath/slowpath"
)

func runServe(ctx context.Context, args []string, e env) error {
	// Signals first: a SIGHUP or SIGTERM while the engines, the router and
	// the listeners start would otherwise kill the process (Go's default
	// action). One that arrives early is acted on once serving.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	a, err := parseServe(args, e)
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.start(e); err != nil {
		return err
	}
	return a.serve(ctx, sigs, e)
}

// serveApp is one `warmpath serve` run: its config, what it started (each
// with its cleanup on closers) and the bound listeners.
type serveApp struct {
	cfg       slowpath.Config
	fileBytes []byte // the config file as read, for the reload watcher
	cfgPath   string
	demo      bool
	demoAdmin bool
	record    string
	recordN   int
	log       *slog.Logger

	closers closers
	srv     *slowpath.Server
	apiLn   net.Listener
	adminLn net.Listener // nil: no admin listener
	stopped bool         // the server was stopped by serve (drained or shut down)
}

// parseServe reads serve's flags and config file: flags given explicitly
// win over the file, defaults do not.
func parseServe(args []string, e env) (*serveApp, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	listen := fs.String("listen", ":8080", "API listen address (overrides the config file's `listen`)")
	admin := fs.String("admin", "127.0.0.1:9090", "metrics and debug listen address (overrides `admin`; \"\" disables)")
	cfgPath := fs.String("config", "", "YAML config `file` (see slowpath/README.md); reloaded on SIGHUP and on change")
	demo := fs.Bool("demo", false, "start 3 in-process simulated engines serving \""+demoModel+"\" and route to them")
	demoAdmin := fs.Bool("demo-admin", false, "with --demo: the engines serve POST /admin/faults and /admin/restart (fault injection; off by default)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "", "log format: text or json (overrides `log.format`; default text)")
	record := fs.String("record", "", "record a sample of the proxied requests to `file` for `warmpath-bench analyze` (hashed prompts only, never text)")
	recordN := fs.Int("record-requests", 10000, "with --record: stop after this many requests")
	natsURL := fs.String("nats", "", "NATS server `URL`s, comma-separated: share routing state with the other instances (overrides cluster.nats_url)")
	instance := fs.String("instance", "", "this instance's unique `name` in the fleet (overrides cluster.instance; default the hostname)")
	ff := addFastpathFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("serve: --log-level: %w", err)
	}
	switch *logFormat {
	case "", slowpath.LogFormatText, slowpath.LogFormatJSON:
	default:
		return nil, fmt.Errorf("serve: --log-format: must be text or json, got %q", *logFormat)
	}

	a := &serveApp{cfg: slowpath.Default(), cfgPath: *cfgPath, demo: *demo, demoAdmin: *demoAdmin, record: *record, recordN: *recordN}
	cfg := &a.cfg
	if *cfgPath != "" {
		if err := slowpath.CheckConfigPerms(*cfgPath); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		b, err := os.ReadFile(*cfgPath)
		if err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		if *cfg, err = slowpath.ParseConfig(b); err != nil {
			return nil, fmt.Errorf("serve: config %s: %w", *cfgPath, err)
		}
		a.fileBytes = b
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "log-format":
			cfg.Log.Format = *logFormat
		case "listen":
			cfg.Listen = *listen
		case "admin":
			cfg.Admin = *admin
		case "nats":
			cfg.Cluster.NATSURL = nil
			for u := range strings.SplitSeq(*natsURL, ",") {
				if u = strings.TrimSpace(u); u != "" {
					cfg.Cluster.NATSURL = append(cfg.Cluster.NATSURL, u)
				}
			}
		case "instance":
			cfg.Cluster.Instance = *instance
		}
	})
	ff.apply(fs, &cfg.Fastpath)
	a.log = slog.New(slowpath.NewLogHandler(e.stderr, cfg.Log.Format, level))
	return a, nil
}

// close runs the cleanups of what start started, last started first.
func (a *serveApp) close() {
	if err := a.closers.close(); err != nil {
		a.log.Warn("shutdown", "err", err)
	}
}

// start starts the demo engines, the fast path, the server, the request
// recorder and the config watcher, and binds the listeners; each pushes its
// cleanup, so on an error close stops what did start.
func (a *serveApp) start(e env) error {
	cfg, log := &a.cfg, a.log
	if soft, hard, err := slowpath.RaiseFDLimit(); err != nil {
		log.Warn("open-file limit unknown", "err", err)
	} else {
		log.Info("open-file limit", "soft", soft, "hard", hard)
	}

	if a.demo {
		engines, err := startDemoEngines(log, a.demoAdmin)
		if err != nil {
			return err
		}
		a.closers.push("demo engines", func() error { return closeEngines(engines) })
		for _, en := range engines {
			cfg.Replicas = append(cfg.Replicas, slowpath.ReplicaConfig{Address: en.Addr(), Models: []string{demoModel}})
		}
		if a.cfgPath == "" {
			cfg.Shutdown.DrainDelay = 0 // no load balancer in front of a demo
		}
	}
	if len(cfg.Replicas) == 0 {
		return errors.New("serve: no replicas: pass --config FILE with a replicas list, or --demo")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	dp, err := openFastpath(&cfg.Fastpath, e.probe, log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// One cleanup for the fast path: the datapath alone until its control
	// loop runs, then both (fr.stop closes the datapath).
	var fr *fastpathRun
	if dp != nil {
		a.closers.push("fast path", func() error {
			if fr != nil {
				return fr.stop()
			}
			return dp.Close()
		})
	}
	if a.srv, err = slowpath.New(*cfg, log); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := a.srv
	// A server that never served stops here; one that served was stopped
	// by serve (drained or shut down) before the cleanups run.
	a.closers.push("server", func() error {
		if a.stopped {
			return nil
		}
		return srv.Shutdown(context.Background())
	})
	srv.Registry().MustRegister(buildInfoGauge())
	if dp != nil {
		if fr, err = startFastpath(dp, &cfg.Fastpath, srv, log); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if n := srv.Cluster(); n != nil && fr != nil {
		// Fast-path entries are shared with the other edge hosts.
		fr.ctl.SetEntryHook(n.PublishEntry)
		n.SetEntryHandler(fr.ctl.ApplyPeerEntry)
	}
	if a.record != "" {
		rec, err := slowpath.NewRecorder(a.record, a.recordN, srv.Router().HashConfig().BlockTokens, log)
		if err != nil {
			return fmt.Errorf("serve: --record: %w", err)
		}
		a.closers.push("request sample", rec.Close)
		srv.Observer = slowpath.Observers{srv.Observer, rec}
		log.Info("recording a request sample", "file", a.record, "requests", a.recordN)
	}
	// Reloads apply the file's replica list; demo engines are not in the
	// file, so a demo run only reloads when it has no config file.
	if a.cfgPath != "" && !a.demo {
		if err := srv.WatchConfigFile(a.cfgPath, a.fileBytes); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}

	if a.apiLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("serve: listen %s: %w", cfg.Listen, err)
	}
	a.closers.push("api listener", closeListener(a.apiLn))
	if cfg.Admin != "" {
		if a.adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
			return fmt.Errorf("serve: listen admin %s: %w", cfg.Admin, err)
		}
		a.closers.push("admin listener", closeListener(a.adminLn))
	}
	return nil
}

// serve serves on the bound listeners until ctx ends, a listener fails or a
// SIGTERM/SIGINT arrives (SIGHUP reloads), then stops the server: a signal
// drains it (drain), anything else shuts it down within drain_timeout.
func (a *serveApp) serve(ctx context.Context, sigs <-chan os.Signal, e env) error {
	cfg, log, srv, apiLn, adminLn := &a.cfg, a.log, a.srv, a.apiLn, a.adminLn
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(apiLn) }()
	if adminLn != nil {
		go func() { errc <- srv.ServeAdmin(adminLn) }()
	}
	log.Info("warmpath serving", "api", apiLn.Addr().String(), "tls", cfg.TLS.Enabled(), "admin", addrString(adminLn), "replicas", len(cfg.Replicas))
	if a.demo {
		log.Info("demo: try this", "curl", demoCurl(hostPort(apiLn.Addr())))
		fmt.Fprintf(e.stdout, "\nwarmpath demo: %d simulated engines serving %q behind http://%s\ntry:\n  %s\n\n",
			demoEngines, demoModel, hostPort(apiLn.Addr()), demoCurl(hostPort(apiLn.Addr())))
	}
	if e.ready != nil {
		var aa net.Addr
		if adminLn != nil {
			aa = adminLn.Addr()
		}
		e.ready(apiLn.Addr(), aa)
	}

	var serveErr error
	graceful := false
	probed := srv.Probed()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-probed:
			probed = nil
			ok, why := srv.Ready()
			log.Info("first health round done", "ready", ok, "reason", why)
			if err := sdNotify("READY=1"); err != nil {
				log.Warn("service manager notification", "err", err)
			}
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				if err := srv.Reload(); err != nil {
					log.Error("reload on SIGHUP failed", "err", err)
				} else {
					log.Info("reloaded the config on SIGHUP")
				}
				continue
			}
			log.Info("shutting down: readiness fails, then the listener closes and in-flight requests drain (a second signal exits at once)",
				"signal", sig.String(), "drain_delay", cfg.Shutdown.DrainDelay, "drain_timeout", cfg.DrainTimeout)
			graceful = true
			break loop
		case serveErr = <-errc:
			if serveErr != nil {
				break loop
			}
		}
	}
	a.stopped = true
	if graceful {
		if err := sdNotify("STOPPING=1"); err != nil {
			log.Warn("service manager notification", "err", err)
		}
		if err := drain(ctx, srv, sigs, log); err != nil {
			return err
		}
	} else {
		srv.SetDraining()
		sctx, cancel := context.WithTimeout(context.Background(), max(cfg.DrainTimeout, time.Second))
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "err", err)
		}
	}
	if serveErr != nil {
		return fmt.Errorf("serve: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}

// closeListener is ln's cleanup: Serve's shutdown closes a listener it
// served, so an already closed one is not an error.
func closeListener(ln net.Listener) func() error {
	return func() error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}

// errSecondSignal ends serve when a second SIGTERM/SIGINT cut the drain.
var errSecondSignal = errors.New("serve: second signal during the drain: stopped at once, in-flight requests cut")

// drain runs srv.Drain (readiness fails, shutdown.drain_delay, stop
// accepting, in-flight requests finish). A second SIGTERM or SIGINT, or ctx
// ending, cuts it: the open connections are closed at once.
func drain(ctx context.Context, srv *slowpath.Server, sigs <-chan os.Signal, log *slog.Logger) error {
	dctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Drain(dctx) }()
	var forced error
	for {
		select {
		case err := <-done:
			if err != nil {
				log.Warn("shutdown", "err", err)
			}
			return forced
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				continue // nothing to reload on the way out
			}
			log.Warn("second signal: stopping now, closing in-flight connections", "signal", sig.String())
			forced = errSecondSignal
			cancel()
		case <-ctx.Done():
			cancel()
			ctx = context.Background() // once
		}
	}
}

func addrString(ln net.Listener) string {
	if ln == nil {
		return "off"
	}
	return ln.Addr().String()
}
