package fastpath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/fastpath/testbed"
)

// TestPinDirPrivate: the pin directory is 0700 whether fresh or pre-existing
// with group/world access (tightened), the pinned maps are not writable by
// group or others, and a symlink in its place is refused.
func TestPinDirPrivate(t *testing.T) {
	testbed.RequireRoot(t)
	fs := testbed.BPFFS(t)
	tests := []struct {
		name    string
		prepare func(t *testing.T, pin string)
		wantErr string
	}{
		{name: "fresh", prepare: func(*testing.T, string) {}},
		{name: "world-writable", prepare: func(t *testing.T, pin string) {
			if err := os.Mkdir(pin, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(pin, 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "group-writable", prepare: func(t *testing.T, pin string) {
			if err := os.Mkdir(pin, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(pin, 0o770); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "symlink", prepare: func(t *testing.T, pin string) {
			if err := os.Mkdir(pin+"-real", 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(pin+"-real", pin); err != nil {
				t.Skipf("bpffs has no symlinks here: %v", err)
			}
		}, wantErr: "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pin := filepath.Join(fs, strings.ReplaceAll(tc.name, "-", ""))
			tc.prepare(t, pin)
			k, err := OpenKernel(Options{PinPath: pin})
			if tc.wantErr != "" {
				if err == nil {
					_ = k.Close()
				}
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = k.Close() })
			fi, err := os.Stat(pin)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != 0o700 {
				t.Fatalf("pin dir mode %v, want 0700", got)
			}
			ents, err := os.ReadDir(pin)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) == 0 {
				t.Fatal("nothing pinned")
			}
			for _, e := range ents {
				info, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				if info.Mode().Perm()&0o022 != 0 {
					t.Errorf("pinned %s mode %v is writable by group or others", e.Name(), info.Mode().Perm())
				}
			}
		})
	}
}
