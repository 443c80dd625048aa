package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/fastpath/testbed"
)

// TestFastPathWithUnitCapabilities runs `warmpath serve` with the XDP fast
// path (mode kernel) as an unprivileged user holding exactly the unit's
// AmbientCapabilities (setpriv does what systemd does), in a fresh network
// namespace: the program must attach and pin. Without the capabilities the
// same command must fail, so the capabilities are what makes it work.
func TestFastPathWithUnitCapabilities(t *testing.T) {
	testbed.RequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skipf("setpriv (util-linux) not installed: %v", err)
	}
	var caps []string
	for _, c := range strings.Fields(one(t, unitKeys(t, unitFile), "AmbientCapabilities")) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	capList := strings.Join(caps, ",")

	dir := t.TempDir()
	bin := filepath.Join(dir, "warmpath")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ns := testbed.NewNS(t, "caps")
	testbed.Veth(t, ns, "wcap", "", ns, "wcapp", "")
	bpffs := testbed.BPFFS(t)
	const nobody = 65534
	// The unprivileged user must reach the binary, the config and the pin
	// directory, as the unit's ReadWritePaths and group-readable config do.
	for _, d := range []string{filepath.Dir(dir), dir, filepath.Dir(bpffs)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(bpffs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "warmpath.yaml")
	body := fmt.Sprintf("listen: 127.0.0.1:18080\nadmin: \"\"\nreplicas:\n  - {address: 127.0.0.1:9, models: [m]}\n"+
		"fastpath:\n  mode: kernel\n  interface: wcap\n  attach: driver\n  services: [10.100.0.1:8000]\n  pin_path: %s/warmpath\n", bpffs)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}

	serve := func(privs ...string) (log string, attached bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args := append([]string{"netns", "exec", ns.Name, "setpriv", fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups"}, privs...)
		args = append(args, bin, "serve", "--config", cfg, "--log-level", "info")
		cmd := exec.CommandContext(ctx, "ip", args...)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "fast path on") && strings.Contains(sc.Text(), "mode=kernel") {
				attached = true
				_ = cmd.Process.Signal(os.Interrupt)
			}
		}
		_ = cmd.Wait()
		return b.String(), attached
	}

	log, ok := serve("--inh-caps="+capList, "--ambient-caps="+capList, "--bounding-set=-all,"+capList)
	if !ok {
		t.Fatalf("with %s only, the fast path did not attach:\n%s", capList, log)
	}
	t.Logf("attached as uid %d with %s", nobody, capList)
	if log, ok := serve("--inh-caps=-all", "--bounding-set=-all"); ok || !strings.Contains(log, "fastpath") {
		t.Fatalf("without capabilities: attached %v, log:\n%s", ok, log)
	}
}
