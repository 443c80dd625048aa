package slowpath

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/affinity"
)

// TestHashKeyFile: with hash_key_file the prefix hashes (what the cluster
// sends to its peers) are keyed: not what anyone can compute from a
// guessed prompt, the same for every instance with the same file. A key
// file readable by others or too short is refused.
func TestHashKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("key", "0123456789abcdef0123456789abcdef\n", 0o600)
	hashes := func(key string) []uint64 {
		t.Helper()
		k, _, err := LoadHashKey(key)
		if err != nil {
			t.Fatal(err)
		}
		var pr affinity.Prompt
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("guess ", 200) + `"}]}`)
		if err := affinity.NewKeyedParser(affinity.HashConfig{}, k).ParseChat(body, &pr); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(pr.Hashes)
	}
	plain, keyed, again := hashes(""), hashes(good), hashes(good)
	if len(plain) == 0 || slices.Equal(plain, keyed) || !slices.Equal(keyed, again) {
		t.Fatalf("plain %x\nkeyed %x\nagain %x", plain, keyed, again)
	}
	if other := hashes(write("key2", "another secret of enough length", 0o600)); slices.Equal(other, keyed) {
		t.Fatal("two keys, same hashes")
	}
	for _, tc := range []struct{ name, path, want string }{
		{"readable by others", write("open", "0123456789abcdef0123", 0o644), "readable by others"},
		{"too short", write("short", "tiny", 0o600), "want at least 16"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("127.0.0.1:1")
			cfg.HashKeyFile = tc.path
			if _, err := New(cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}
