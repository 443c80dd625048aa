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

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

// demoModel is the model name the demo engines serve.
const demoModel = "demo-llama-8b"

// demoEngines is how many simulated engines --demo starts.
const demoEngines = 3

func runServe(ctx context.Context, args []string, e env) error {
	// Signals first: a SIGHUP or SIGTERM while the engines, the router and
	// the listeners start would otherwise kill the process (Go's default
	// action). One that arrives early is acted on once serving.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	listen := fs.String("listen", ":8080", "API listen address (overrides the config file's `listen`)")
	admin := fs.String("admin", "127.0.0.1:9090", "metrics and debug listen address (overrides `admin`; \"\" disables)")
	cfgPath := fs.String("config", "", "YAML config `file` (see slowpath/README.md); reloaded on SIGHUP and on change")
	demo := fs.Bool("demo", false, "start 3 in-process simulated engines serving \""+demoModel+"\" and route to them")
	demoAdmin := fs.Bool("demo-admin", false, "with --demo: the engines serve POST /admin/faults and /admin/restart (fault injection; off by default)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "", "log format: text or json (overrides `log.format`; default text)")
	record := fs.String("record", "", "record a sample of the proxied requests to `file` for `warmpath analyze` (hashed prompts only, never text)")
	recordN := fs.Int("record-requests", 10000, "with --record: stop after this many requests")
	natsURL := fs.String("nats", "", "NATS server `URL`s, comma-separated: share routing state with the other instances (overrides cluster.nats_url)")
	instance := fs.String("instance", "", "this instance's unique `name` in the fleet (overrides cluster.instance; default the hostname)")
	ff := addFastpathFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("serve: --log-level: %w", err)
	}
	switch *logFormat {
	case "", slowpath.LogFormatText, slowpath.LogFormatJSON:
	default:
		return fmt.Errorf("serve: --log-format: must be text or json, got %q", *logFormat)
	}

	cfg := slowpath.Default()
	var fileBytes []byte
	if *cfgPath != "" {
		if err := slowpath.CheckConfigPerms(*cfgPath); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		b, err := os.ReadFile(*cfgPath)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if cfg, err = slowpath.ParseConfig(b); err != nil {
			return fmt.Errorf("serve: config %s: %w", *cfgPath, err)
		}
		fileBytes = b
	}
	// Flags given explicitly win over the file; defaults do not.
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
	log := slog.New(slowpath.NewLogHandler(e.stderr, cfg.Log.Format, level))
	if soft, hard, err := slowpath.RaiseFDLimit(); err != nil {
		log.Warn("open-file limit unknown", "err", err)
	} else {
		log.Info("open-file limit", "soft", soft, "hard", hard)
	}

	if *demo {
		engines, err := startDemoEngines(log, *demoAdmin)
		if err != nil {
			return err
		}
		defer func() {
			for _, en := range engines {
				en.Close()
			}
		}()
		for _, en := range engines {
			cfg.Replicas = append(cfg.Replicas, slowpath.ReplicaConfig{Address: en.Addr(), Models: []string{demoModel}})
		}
		if *cfgPath == "" {
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
	srv, err := slowpath.New(cfg, log)
	if err != nil {
		if dp != nil {
			_ = dp.Close()
		}
		return fmt.Errorf("serve: %w", err)
	}
	srv.Registry().MustRegister(buildInfoGauge())
	var fr *fastpathRun
	if dp != nil {
		if fr, err = startFastpath(dp, &cfg.Fastpath, srv, log); err != nil {
			_ = dp.Close()
			_ = srv.Shutdown(context.Background())
			return fmt.Errorf("serve: %w", err)
		}
	}
	if n := srv.Cluster(); n != nil && fr != nil {
		// Fast-path entries are shared with the other edge hosts.
		fr.ctl.SetEntryHook(n.PublishEntry)
		n.SetEntryHandler(fr.ctl.ApplyPeerEntry)
	}
	defer func() {
		if err := fr.stop(); err != nil {
			log.Warn("close fast path", "err", err)
		}
	}()
	if *record != "" {
		rec, err := slowpath.NewRecorder(*record, *recordN, srv.Router().HashConfig().BlockTokens, log)
		if err != nil {
			_ = srv.Shutdown(context.Background())
			return fmt.Errorf("serve: --record: %w", err)
		}
		srv.Observer = slowpath.Observers{srv.Observer, rec}
		defer func() {
			if err := rec.Close(); err != nil {
				log.Warn("request sample", "err", err)
			}
		}()
		log.Info("recording a request sample", "file", *record, "requests", *recordN)
	}
	// Reloads apply the file's replica list; demo engines are not in the
	// file, so a demo run only reloads when it has no config file.
	if *cfgPath != "" && !*demo {
		if err := srv.WatchConfigFile(*cfgPath, fileBytes); err != nil {
			_ = srv.Shutdown(context.Background())
			return fmt.Errorf("serve: %w", err)
		}
	}

	apiLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return fmt.Errorf("serve: listen %s: %w", cfg.Listen, err)
	}
	var adminLn net.Listener
	if cfg.Admin != "" {
		if adminLn, err = net.Listen("tcp", cfg.Admin); err != nil {
			apiLn.Close()
			_ = srv.Shutdown(context.Background())
			return fmt.Errorf("serve: listen admin %s: %w", cfg.Admin, err)
		}
	}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(apiLn) }()
	if adminLn != nil {
		go func() { errc <- srv.ServeAdmin(adminLn) }()
	}
	log.Info("warmpath serving", "api", apiLn.Addr().String(), "tls", cfg.TLS.Enabled(), "admin", addrString(adminLn), "replicas", len(cfg.Replicas))
	if *demo {
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

func demoCurl(hostport string) string {
	return "curl -sN http://" + hostport + "/v1/chat/completions -H 'Content-Type: application/json' -d '" +
		`{"model":"` + demoModel + `","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say hello."}]}` + "'"
}

// startDemoEngines starts the simulated engines on loopback ephemeral ports,
// 20x faster than life.
func startDemoEngines(log *slog.Logger, admin bool) ([]*enginesim.Server, error) {
	var out []*enginesim.Server
	quiet := log
	for i := range demoEngines {
		c := enginesim.DefaultConfig()
		c.ServedModelNames = []string{demoModel}
		c.TimeScale = 0.05
		c.Seed = uint64(i + 1)
		c.Logger = quiet
		c.OutputLen.Median = 40
		c.OutputLen.Max = 256
		c.EnableAdmin = admin
		en, err := enginesim.Start(c, "127.0.0.1:0")
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("start demo engine %d: %w", i, err)
		}
		out = append(out, en)
	}
	addrs := make([]string, len(out))
	for i, en := range out {
		addrs[i] = en.Addr()
	}
	log.Info("demo engines started", "model", demoModel, "addrs", strings.Join(addrs, ","))
	return out, nil
}
