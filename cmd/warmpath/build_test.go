package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReproducibleBuild runs `make build` twice, in this tree and in a copy
// of it at another path, and requires byte-identical binaries: static
// (CGO_ENABLED=0), without build paths (-trimpath), stamped from git, not
// the clock. It also checks what the stamp says.
func TestReproducibleBuild(t *testing.T) {
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	src := filepath.Join(tmp, "elsewhere", "warmpath-copy")
	files, err := exec.Command("git", "-C", root, "ls-files", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for f := range strings.SplitSeq(strings.TrimSpace(string(files)), "\n") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(src, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The copy has no .git: both builds get the stamp computed here.
	stamp := map[string]string{"VERSION": "v9.9.9-test", "COMMIT": "0123456789abcdef0123456789abcdef01234567", "BUILD_DATE": "2026-01-02T03:04:05Z"}
	build := func(dir, bin string) {
		t.Helper()
		args := []string{"-s", "build", "BIN=" + bin}
		for k, v := range stamp {
			args = append(args, k+"="+v)
		}
		cmd := exec.Command("make", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build in %s: %v\n%s", dir, err, out)
		}
	}
	a, b := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	build(root, a)
	build(src, b)
	for _, bin := range []string{"warmpath", "warmpath-bench", "enginesim"} {
		ha, ba := fileSHA(t, filepath.Join(a, bin))
		hb, _ := fileSHA(t, filepath.Join(b, bin))
		if ha != hb {
			t.Errorf("%s differs between the two builds: %s vs %s", bin, ha, hb)
		}
		for _, p := range []string{root, src, tmp} {
			if bytes.Contains(ba, []byte(p)) {
				t.Errorf("%s contains the build path %s", bin, p)
			}
		}
		t.Logf("%s sha256 %s (both builds)", bin, ha)
	}
	info, err := exec.Command("go", "version", "-m", filepath.Join(a, "warmpath")).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath=true"} {
		if !strings.Contains(string(info), want) {
			t.Errorf("go version -m lacks %s:\n%s", want, info)
		}
	}
	out, err := exec.Command(filepath.Join(a, "warmpath"), "version", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v buildInfo
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version --json: %v\n%s", err, out)
	}
	if v.Version != stamp["VERSION"] || v.Commit != stamp["COMMIT"] || v.BuildDate != stamp["BUILD_DATE"] {
		t.Fatalf("stamp %+v, want %v", v, stamp)
	}
}

func fileSHA(t *testing.T, path string) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), b
}
