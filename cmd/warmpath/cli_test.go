package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// runCLI runs the command line as main does: what it prints (the error
// line main adds included) and the exit status.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), args, env{stdout: &out, stderr: &errb})
	code = exitCode(err, &errb)
	return out.String(), errb.String(), code
}

func TestBenchHelp(t *testing.T) {
	for _, h := range []string{"--help", "-h", "help"} {
		out, _, code := runCLI(t, "bench", h)
		if code != 0 || !strings.Contains(out, "\n  sim ") || !strings.Contains(out, "\n  live ") {
			t.Errorf("bench %s: exit %d, stdout %q; want 0 and the suites", h, code, out)
		}
	}
	if _, errOut, code := runCLI(t, "bench"); code != 2 || !strings.Contains(errOut, "suites:") {
		t.Errorf("bench without a suite: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, "bench", "simulate"); code != 2 || strings.Count(errOut, `unknown suite "simulate"`) != 1 {
		t.Errorf("bench simulate: exit %d, stderr %q", code, errOut)
	}
}

// TestBenchSuiteHelpOwnFlags: each suite's -h lists its own flags only.
func TestBenchSuiteHelpOwnFlags(t *testing.T) {
	simOnly := []string{"-trace", "-parallel", "-routers", "-sync-delay", "-delay-routers"}
	liveOnly := []string{"-skip-nginx", "-fleets", "-commit"}
	common := []string{"-out", "-smoke", "-seed", "-replicas"}
	for _, tc := range []struct {
		suite       string
		want, never []string
	}{{"sim", append(simOnly, common...), liveOnly}, {"live", append(liveOnly, common...), simOnly}} {
		_, errOut, code := runCLI(t, "bench", tc.suite, "--help")
		if code != 0 {
			t.Errorf("bench %s --help: exit %d", tc.suite, code)
		}
		for _, f := range tc.want {
			if !strings.Contains(errOut, "  "+f+" ") && !strings.Contains(errOut, "  "+f+"\n") {
				t.Errorf("bench %s --help lacks %s:\n%s", tc.suite, f, errOut)
			}
		}
		for _, f := range tc.never {
			if strings.Contains(errOut, "  "+f) {
				t.Errorf("bench %s --help shows the other suite's %s", tc.suite, f)
			}
		}
	}
}

// TestBadFlagOnce: a wrong flag is reported once (by the flag package,
// with the command's flags), exit status 2; main adds nothing.
func TestBadFlagOnce(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--nope"}, {"check", "--nope"}, {"version", "--nope"}, {"bench", "sim", "--nope"},
		{"bench", "live", "--nope"}, {"analyze", "--nope"}, {"status", "--nope"},
	} {
		_, errOut, code := runCLI(t, args...)
		if code != 2 || strings.Count(errOut, "flag provided but not defined: -nope") != 1 || strings.Contains(errOut, "warmpath: flag") {
			t.Errorf("%q: exit %d, stderr:\n%s", args, code, errOut)
		}
	}
	// A bad value too.
	_, errOut, code := runCLI(t, "bench", "sim", "--parallel", "many")
	if code != 2 || strings.Count(errOut, `invalid value "many" for flag -parallel`) != 1 {
		t.Errorf("bad value: exit %d, stderr:\n%s", code, errOut)
	}
	// Errors after parsing are printed by main, once.
	_, errOut, code = runCLI(t, "serve", "--listen", "127.0.0.1:0", "--admin", "")
	if code != 1 || strings.Count(errOut, "no replicas") != 1 {
		t.Errorf("serve without replicas: exit %d, stderr:\n%s", code, errOut)
	}
	var fe flagError
	err := run(context.Background(), []string{"serve", "--nope"}, env{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	if !errors.As(err, &fe) || !errors.Is(err, errUsage) {
		t.Errorf("serve --nope: %T %v", err, err)
	}
}
