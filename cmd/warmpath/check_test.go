package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files under testdata/")

// TestCheckGolden runs `warmpath check` on a table of config files and
// compares what it prints (every error with its line and field) and its
// exit code with testdata/check/*.golden.
func TestCheckGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/check/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			var out, errb syncBuf
			err := run(context.Background(), []string{"check", "--config", f}, env{stdout: &out, stderr: &errb})
			got := "exit " + exitStatus(err) + "\n--- stdout\n" + out.String() + "--- stderr\n" + errb.String()
			if err != nil {
				got += "warmpath: " + err.Error() + "\n"
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			if *updateGolden {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Fatalf("check %s:\n%s\nwant:\n%s", f, got, want)
			}
		})
	}
}

// exitStatus is what main exits with.
func exitStatus(err error) string {
	return strconv.Itoa(exitCode(err, io.Discard))
}

func TestCheckUsage(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "--config"}, {"check", "--config", "a.yaml", "extra"}} {
		var out, errb syncBuf
		err := run(context.Background(), args, env{stdout: &out, stderr: &errb})
		if !errors.Is(err, errUsage) && !strings.Contains(err.Error(), "flag needs an argument") {
			t.Errorf("%q: err %v, want usage", args, err)
		}
	}
	var out, errb syncBuf
	err := run(context.Background(), []string{"check", "--config", filepath.Join(t.TempDir(), "missing.yaml")}, env{stdout: &out, stderr: &errb})
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err %v", err)
	}
}

// TestCheckWorldWritable: check refuses what serve refuses at start.
func TestCheckWorldWritable(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("replicas: [{address: 127.0.0.1:1, models: [m]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o666); err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuf
	err := run(context.Background(), []string{"check", "--config", f}, env{stdout: &out, stderr: &errb})
	if err == nil || !strings.Contains(errb.String(), "world-writable") {
		t.Fatalf("err %v, stderr %q", err, errb.String())
	}
}
