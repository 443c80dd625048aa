package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeRefusesWritableConfig: serve refuses a config file anyone could
// rewrite (world-writable file, or world-writable directory without the
// sticky bit) and names the file and the fix. The accepted cases carry an
// invalid weight, so reaching the validation error proves the permission
// check passed.
func TestServeRefusesWritableConfig(t *testing.T) {
	const body = "replicas:\n  - address: 127.0.0.1:1\n    models: [m]\n    weight: -2\n"
	const valid = "replicas[0].weight"
	tests := []struct {
		name     string
		fileMode os.FileMode
		dirMode  os.FileMode // os.ModeSticky allowed
		want     string      // substring of the error
		wantDir  bool        // the error names the directory
	}{
		{name: "private", fileMode: 0o600, dirMode: 0o700, want: valid},
		{name: "group-readable", fileMode: 0o644, dirMode: 0o755, want: valid},
		{name: "world-writable file", fileMode: 0o666, dirMode: 0o755, want: "world-writable"},
		{name: "world-writable file in sticky dir", fileMode: 0o646, dirMode: 0o777 | os.ModeSticky, want: "world-writable"},
		{name: "world-writable dir", fileMode: 0o644, dirMode: 0o777, want: "world-writable directory", wantDir: true},
		{name: "world-writable sticky dir", fileMode: 0o644, dirMode: 0o777 | os.ModeSticky, want: valid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "etc")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(f, tc.fileMode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.dirMode); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
			var out, errb syncBuf
			err := run(context.Background(), []string{"serve", "--config", f}, env{stdout: &out, stderr: &errb})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to contain %q", err, tc.want)
			}
			if tc.want == valid {
				return
			}
			fix := "chmod o-w " + f
			if tc.wantDir {
				fix = "chmod o-w " + dir
			}
			if !strings.Contains(err.Error(), f) || !strings.Contains(err.Error(), fix) {
				t.Fatalf("err %q does not name the file and the fix %q", err, fix)
			}
		})
	}
}

// TestServeAdminDefaultLoopback: the --admin flag's default is a loopback
// address (the metrics and debug listener is never public by default).
func TestServeAdminDefaultLoopback(t *testing.T) {
	var out, errb syncBuf
	_ = run(context.Background(), []string{"serve", "-h"}, env{stdout: &out, stderr: &errb})
	usage := errb.String() + out.String()
	i := strings.Index(usage, "-admin")
	if i < 0 {
		t.Fatalf("no -admin flag in usage:\n%s", usage)
	}
	_, rest, ok := strings.Cut(usage[i:], `(default "`)
	if !ok {
		t.Fatalf("-admin has no default:\n%s", usage[i:])
	}
	def, _, _ := strings.Cut(rest, `"`)
	host, _, err := net.SplitHostPort(def)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Fatalf("--admin default %q is not loopback", def)
	}
}
