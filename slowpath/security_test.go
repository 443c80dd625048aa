package slowpath

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigPermsRefused: NewFromFile and Reload refuse a world-writable
// config file, naming it and the fix; the running replica set stays.
func TestConfigPermsRefused(t *testing.T) {
	a := startFakeEngine(t)
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("replicas:\n  - {address: "+a.addr+", models: [m]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewFromFile(f, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := os.Chmod(f, 0o666); err != nil {
		t.Fatal(err)
	}
	want := "chmod o-w " + f
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("reload of a world-writable file: err %v, want %q", err, want)
	}
	if n := len(s.Replicas()); n != 1 {
		t.Fatalf("replicas after refused reload: %d, want 1", n)
	}
	if _, err := NewFromFile(f, testLogger(t)); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("NewFromFile: err %v, want %q", err, want)
	}
	if _, err := LoadConfig(f); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("LoadConfig: err %v, want %q", err, want)
	}
}
