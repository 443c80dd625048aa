package main

import (
	"bytes"
	"context"
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

func TestHelp(t *testing.T) {
	for _, h := range []string{"--help", "-h", "help"} {
		out, _, code := runCLI(t, h)
		if code != 0 || !strings.Contains(out, "\n  sim ") || !strings.Contains(out, "\n  live ") || !strings.Contains(out, "\n  analyze ") {
			t.Errorf("%s: exit %d, stdout %q; want 0 and the commands", h, code, out)
		}
	}
	if _, errOut, code := runCLI(t); code != 2 || !strings.Contains(errOut, "commands:") {
		t.Errorf("no command: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, "simulate"); code != 2 || strings.Count(errOut, `unknown command "simulate"`) != 1 {
		t.Errorf("simulate: exit %d, stderr %q", code, errOut)
	}
}

// TestSuiteHelpOwnFlags: each suite's -h lists its own flags only.
func TestSuiteHelpOwnFlags(t *testing.T) {
	simOnly := []string{"-trace", "-parallel", "-routers", "-sync-delay", "-delay-routers"}
	liveOnly := []string{"-skip-nginx", "-fleets", "-commit", "-warmpath", "-enginesim"}
	common := []string{"-out", "-smoke", "-seed", "-replicas"}
	for _, tc := range []struct {
		suite       string
		want, never []string
	}{{"sim", append(simOnly, common...), liveOnly}, {"live", append(liveOnly, common...), simOnly}} {
		_, errOut, code := runCLI(t, tc.suite, "--help")
		if code != 0 {
			t.Errorf("%s --help: exit %d", tc.suite, code)
		}
		for _, f := range tc.want {
			if !strings.Contains(errOut, "  "+f+" ") && !strings.Contains(errOut, "  "+f+"\n") {
				t.Errorf("%s --help lacks %s:\n%s", tc.suite, f, errOut)
			}
		}
		for _, f := range tc.never {
			if strings.Contains(errOut, "  "+f) {
				t.Errorf("%s --help shows the other suite's %s", tc.suite, f)
			}
		}
	}
}

// TestBadFlagOnce: a wrong flag is reported once (by the flag package,
// with the command's flags), exit status 2; main adds nothing.
func TestBadFlagOnce(t *testing.T) {
	for _, args := range [][]string{{"sim", "--nope"}, {"live", "--nope"}, {"analyze", "--nope"}} {
		_, errOut, code := runCLI(t, args...)
		if code != 2 || strings.Count(errOut, "flag provided but not defined: -nope") != 1 || strings.Contains(errOut, "warmpath-bench: flag") {
			t.Errorf("%q: exit %d, stderr:\n%s", args, code, errOut)
		}
	}
	// A bad value too.
	_, errOut, code := runCLI(t, "sim", "--parallel", "many")
	if code != 2 || strings.Count(errOut, `invalid value "many" for flag -parallel`) != 1 {
		t.Errorf("bad value: exit %d, stderr:\n%s", code, errOut)
	}
	// Errors after parsing are printed by main, once.
	_, errOut, code = runCLI(t, "analyze")
	if code != 1 || strings.Count(errOut, "give exactly one of --trace or --requests") != 1 {
		t.Errorf("analyze without input: exit %d, stderr:\n%s", code, errOut)
	}
}
