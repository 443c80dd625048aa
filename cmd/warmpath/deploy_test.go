package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/cmd/internal/cli"
	"github.com/warmpath/warmpath/slowpath"
)

const (
	unitFile     = "../../deploy/systemd/warmpath.service"
	l7DropIn     = "../../deploy/systemd/l7-only.conf"
	sysusersFile = "../../deploy/systemd/warmpath.sysusers"
	dockerfile   = "../../deploy/docker/Dockerfile"
)

// unitKeys reads a unit file's Key=Value lines (all values of a key, in
// order).
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == ';' || l[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("%s: not Key=Value: %q", path, l)
		}
		out[k] = append(out[k], v)
	}
	return out
}

func one(t *testing.T, keys map[string][]string, k string) string {
	t.Helper()
	if len(keys[k]) != 1 {
		t.Fatalf("unit: %s set %d times, want once", k, len(keys[k]))
	}
	return keys[k][0]
}

// TestSystemdUnitContents: the unit's promises, checked against the code:
// notify readiness, the capabilities and nothing more, a dedicated user
// that sysusers creates, the BPF pin directory writable, a stop timeout
// above the drain, and the config it checks is the one it serves.
func TestSystemdUnitContents(t *testing.T) {
	k := unitKeys(t, unitFile)
	if one(t, k, "Type") != "notify" {
		t.Error("Type must be notify")
	}
	amb, bound := strings.Fields(one(t, k, "AmbientCapabilities")), strings.Fields(one(t, k, "CapabilityBoundingSet"))
	slices.Sort(amb)
	slices.Sort(bound)
	if want := []string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"}; !slices.Equal(amb, want) || !slices.Equal(bound, want) {
		t.Errorf("capabilities ambient %v bounding %v, want both %v", amb, bound, want)
	}
	user := one(t, k, "User")
	if user == "root" || user == "0" || one(t, k, "Group") != user {
		t.Errorf("User=%s Group=%s: want a dedicated user", user, one(t, k, "Group"))
	}
	su, err := os.ReadFile(sysusersFile)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^u ` + regexp.QuoteMeta(user) + ` `).Match(su) {
		t.Errorf("%s does not create user %s", sysusersFile, user)
	}
	for key, want := range map[string]string{
		"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
		"SystemCallArchitectures": "native", "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX AF_NETLINK",
	} {
		if got := one(t, k, key); got != want {
			t.Errorf("%s=%s, want %s", key, got, want)
		}
	}
	if rw := one(t, k, "ReadWritePaths"); !strings.HasPrefix(slowpath.DefaultFastpath().PinPath, rw+"/") {
		t.Errorf("ReadWritePaths=%s does not hold the default pin path %s", rw, slowpath.DefaultFastpath().PinPath)
	}
	stop, err := time.ParseDuration(one(t, k, "TimeoutStopSec"))
	if err != nil || stop <= slowpath.Default().DrainTimeout {
		t.Errorf("TimeoutStopSec=%s must exceed the default drain_timeout %s", one(t, k, "TimeoutStopSec"), slowpath.Default().DrainTimeout)
	}
	start, pre := one(t, k, "ExecStart"), ""
	for _, p := range k["ExecStartPre"] {
		if strings.Contains(p, "/warmpath check ") {
			pre = p
		}
	}
	// The pin directory the service user writes is created for it.
	if !slices.ContainsFunc(k["ExecStartPre"], func(p string) bool {
		return strings.Contains(p, "install -d -o "+user) && strings.HasSuffix(p, slowpath.DefaultFastpath().PinPath)
	}) {
		t.Errorf("no ExecStartPre creates %s for %s: %q", slowpath.DefaultFastpath().PinPath, user, k["ExecStartPre"])
	}
	cfg := regexp.MustCompile(`--config (\S+)`)
	if m, p := cfg.FindStringSubmatch(start), cfg.FindStringSubmatch(pre); m == nil || p == nil || m[1] != p[1] ||
		!strings.Contains(start, "/warmpath serve ") || !strings.Contains(pre, "/warmpath check ") {
		t.Errorf("ExecStartPre %q must check the config ExecStart %q serves", pre, start)
	}
	// Every command the unit runs exists.
	for _, c := range []string{"serve", "check"} {
		if !slices.ContainsFunc(commands, func(x cli.Command[env]) bool { return x.Name == c }) {
			t.Errorf("the unit runs `warmpath %s`, which does not exist", c)
		}
	}
}

// verifyUnit runs systemd-analyze verify on the unit (and drop-ins) in a
// scratch unit directory, with /usr/bin/warmpath pointed at an executable
// that exists here (verify checks it), and returns its output.
func verifyUnit(t *testing.T, unit string, dropIns ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if unit != "" {
		b = []byte(unit)
	}
	b = []byte(strings.ReplaceAll(string(b), "/usr/bin/warmpath", exe))
	if err := os.WriteFile(filepath.Join(dir, "warmpath.service"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(dropIns) > 0 {
		d := filepath.Join(dir, "warmpath.service.d")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, di := range dropIns {
			di = strings.ReplaceAll(di, "/usr/bin/warmpath", exe)
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("%02d.conf", i)), []byte(di), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(dir, "warmpath.service"))
	// The trailing colon keeps the built-in search path after ours (drop-ins
	// are found there).
	cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSystemdAnalyzeVerify: `systemd-analyze verify` is clean (exit 0 and
// no output at all: it only warns about unknown keys) for the unit alone
// and with the L7-only drop-in, and does catch a broken unit.
func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze not installed (Debian: apt-get install systemd; .ci/run installs it): the unit cannot be verified")
	}
	drop, err := os.ReadFile(l7DropIn)
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string][]string{"unit": nil, "unit+l7-only": {string(drop)}} {
		out, err := verifyUnit(t, "", d...)
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("%s: systemd-analyze verify: %v\n%s", name, err, out)
		}
	}
	// The check can fail: an unknown key in a drop-in and a bad value.
	out, _ := verifyUnit(t, "", "[Service]\nAmbientCapability=CAP_BPF\n")
	if !strings.Contains(out, "Unknown key") {
		t.Errorf("verify did not flag an unknown key in a drop-in: %q", out)
	}
}

// pid1 names the init process.
func pid1() string {
	b, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(string(b))
}

// TestSystemdUnitStarts installs a copy of the unit under its own name
// (this tree's binary under /run, DynamicUser instead of the warmpath
// user, a config routing to an engine this test starts), starts it, which
// returns only after READY=1 (Type=notify), checks /health on its admin
// port and stops it. It needs systemd as PID 1 and root.
func TestSystemdUnitStarts(t *testing.T) {
	if p := pid1(); p != "systemd" {
		t.Skipf("PID 1 is %q, not systemd: units cannot be started on this machine (systemd-analyze verify ran instead)", p)
	}
	if os.Geteuid() != 0 {
		t.Skip("installing a unit needs root")
	}
	const name = "warmpath-test-opspack"
	dir := filepath.Join("/run", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "warmpath")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	en, err := enginesim.Start(enginesim.DefaultConfig(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer en.Close()
	admin := freePort(t)
	cfg := filepath.Join(dir, "warmpath.yaml")
	body := fmt.Sprintf("listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nreplicas:\n  - {address: %q, models: [%s]}\n", freePort(t), admin, en.Addr(), enginesim.DefaultConfig().ServedModelNames[0])
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	u := strings.NewReplacer("/usr/bin/warmpath", bin, "/etc/warmpath/warmpath.yaml", cfg,
		"User=warmpath", "DynamicUser=yes", "Group=warmpath\n", "").Replace(string(unit))
	path := filepath.Join("/run/systemd/system", name+".service")
	if err := os.WriteFile(path, []byte(u), 0o644); err != nil {
		t.Fatal(err)
	}
	systemctl := func(args ...string) error {
		out, err := exec.Command("systemctl", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	t.Cleanup(func() {
		_ = systemctl("stop", name)
		_ = os.Remove(path)
		_ = systemctl("daemon-reload")
	})
	if err := systemctl("daemon-reload"); err != nil {
		t.Fatal(err)
	}
	if err := systemctl("start", name); err != nil {
		out, _ := exec.Command("journalctl", "-u", name, "--no-pager", "-n", "50").CombinedOutput()
		t.Fatalf("%v\n%s", err, out)
	}
	resp, err := testClient.Get(fmt.Sprintf("http://127.0.0.1:%d/health", admin))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %d", resp.StatusCode)
	}
	if err := systemctl("stop", name); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// dockerStages splits a Dockerfile into its stages' instructions
// (continuation lines joined).
func dockerStages(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string
	var cur string
	for line := range strings.SplitSeq(string(b), "\n") {
		l := strings.TrimSpace(line)
		if cur == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		ins := cur + l
		cur = ""
		if strings.HasPrefix(strings.ToUpper(ins), "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %q", ins)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], ins)
	}
	return stages
}

// TestDockerfile checks the image statically (no registry is reachable
// here, so it is never built in the tests): two stages; the build runs
// `make build` (the static, reproducible one) with the Go of go.mod; the
// final stage is distroless static, copies only the binary and the licences,
// runs as a non-root user, adds nothing from a URL and serves the config it
// documents.
func TestDockerfile(t *testing.T) {
	st := dockerStages(t)
	if len(st) != 2 {
		t.Fatalf("%d stages, want 2 (build, runtime)", len(st))
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	from := strings.Fields(st[0][0])
	if len(from) < 4 || !strings.HasPrefix(from[1], "golang:"+string(goVer[1])) || from[3] != "build" {
		t.Errorf("build stage %q: want FROM golang:%s... AS build", st[0][0], goVer[1])
	}
	if !slices.ContainsFunc(st[0], func(s string) bool { return regexp.MustCompile(`^RUN make build( |$)`).MatchString(s) }) {
		t.Errorf("build stage does not RUN make build: %q", st[0])
	}
	if f := strings.Fields(st[1][0]); len(f) != 2 || !strings.HasPrefix(f[1], "gcr.io/distroless/static") {
		t.Errorf("runtime stage %q: want FROM gcr.io/distroless/static...", st[1][0])
	}
	var user, entry, cmd string
	for _, stage := range st {
		for _, ins := range stage {
			op, arg, _ := strings.Cut(ins, " ")
			switch strings.ToUpper(op) {
			case "ADD":
				t.Errorf("ADD %s: use COPY (ADD fetches URLs and unpacks archives)", arg)
			case "USER":
				user = arg
			case "ENTRYPOINT":
				entry = arg
			case "CMD":
				cmd = arg
			}
			if strings.Contains(ins, "://") && !strings.HasPrefix(ins, "FROM") {
				t.Errorf("instruction fetches a URL: %q", ins)
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("USER %q: want a non-root user in the final stage", user)
	}
	if entry != `["/usr/bin/warmpath"]` {
		t.Errorf("ENTRYPOINT %s", entry)
	}
	if !strings.Contains(cmd, `"serve", "--config", "/etc/warmpath/warmpath.yaml"`) {
		t.Errorf("CMD %s does not serve /etc/warmpath/warmpath.yaml", cmd)
	}
	for _, ins := range st[1] {
		if strings.HasPrefix(ins, "COPY") && !strings.Contains(ins, "--from=build /src/bin/warmpath ") && !strings.Contains(ins, "/usr/share/doc/warmpath/") {
			t.Errorf("runtime stage copies more than the binary and licences: %q", ins)
		}
	}
}
