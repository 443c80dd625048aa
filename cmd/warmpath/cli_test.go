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

// TestBenchPointer: `warmpath bench ...` and `warmpath analyze ...` name
// the warmpath-bench command line that runs them, exit 2, and run nothing.
func TestBenchPointer(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "sim", "--smoke", "--out", "/nonexistent/x"}, "warmpath-bench sim --smoke --out /nonexistent/x\n"},
		{[]string{"bench", "live", "--fleets", "llamacpp"}, "warmpath-bench live --fleets llamacpp\n"},
		{[]string{"bench"}, "warmpath-bench -h\n"},
		{[]string{"analyze", "--trace", "t.jsonl"}, "warmpath-bench analyze --trace t.jsonl\n"},
	} {
		out, errOut, code := runCLI(t, tc.args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasSuffix(errOut, ": "+tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and one line ending %q", tc.args, code, out, errOut, tc.want)
		}
	}
	out, _, _ := runCLI(t, "help")
	if strings.Contains(out, "\n  bench ") || strings.Contains(out, "\n  analyze ") || !strings.Contains(out, "warmpath-bench (sim, live, analyze)") {
		t.Errorf("help lists the bench commands as warmpath's, or lacks the pointer:\n%s", out)
	}
}

// TestBadFlagOnce: a wrong flag is reported once (by the flag package,
// with the command's flags), exit status 2; main adds nothing.
func TestBadFlagOnce(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--nope"}, {"check", "--nope"}, {"version", "--nope"}, {"status", "--nope"},
		{"detach", "--nope"}, {"decap", "--nope"},
	} {
		_, errOut, code := runCLI(t, args...)
		if code != 2 || strings.Count(errOut, "flag provided but not defined: -nope") != 1 || strings.Contains(errOut, "warmpath: flag") {
			t.Errorf("%q: exit %d, stderr:\n%s", args, code, errOut)
		}
	}
	// A bad value too.
	_, errOut, code := runCLI(t, "serve", "--record-requests", "many")
	if code != 2 || strings.Count(errOut, `invalid value "many" for flag -record-requests`) != 1 {
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
