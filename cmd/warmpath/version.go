package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmpath/warmpath/affinity"
)

// Stamped by `make build` (-ldflags -X): version from `git describe`,
// commit the full hash, buildDate the commit's time (not the wall clock,
// so two builds of one commit are byte for byte the same). A plain `go
// build` leaves them empty; buildInfo then falls back to what the Go
// toolchain recorded.
var (
	version   string
	commit    string
	buildDate string
)

// buildInfo is what `warmpath version --json` prints.
type buildInfo struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	GoVersion  string `json:"go_version"`
	BuildDate  string `json:"build_date"`
	Platform   string `json:"platform"`
	PrefixHash string `json:"prefix_hash"`
}

func currentBuild() buildInfo {
	b := buildInfo{Version: version, Commit: commit, BuildDate: buildDate, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, PrefixHash: affinity.HashPath()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Commit == "":
				b.Commit = s.Value
			case s.Key == "vcs.time" && b.BuildDate == "":
				b.BuildDate = s.Value
			}
		}
	}
	if b.Version == "" {
		b.Version = "dev"
		if len(b.Commit) >= 12 {
			b.Version = "dev-" + b.Commit[:12]
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.BuildDate == "" {
		b.BuildDate = "unknown"
	}
	return b
}

// line is the one-line form (`warmpath --version`).
func (b buildInfo) line() string {
	return fmt.Sprintf("warmpath %s (commit %s, built %s, %s %s, prefix hash %s)",
		b.Version, short(b.Commit), b.BuildDate, b.GoVersion, b.Platform, b.PrefixHash)
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func runVersion(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	asJSON := fs.Bool("json", false, "print version, commit, Go version, build date, platform and prefix-hash path as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected arguments %q", fs.Args())
	}
	b := currentBuild()
	if *asJSON {
		out, err := json.MarshalIndent(b, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", out)
		return err
	}
	fmt.Fprintln(e.stdout, b.line())
	return nil
}

// buildInfoGauge is warmpath_build_info{version,commit,goversion} 1, the
// usual build-info metric: join it to other series to see what runs.
func buildInfoGauge() prometheus.Collector {
	b := currentBuild()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace:   "warmpath",
		Name:        "build_info",
		Help:        "Build of the running binary: version (git describe), commit and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "goversion": b.GoVersion},
	}, func() float64 { return 1 })
}
