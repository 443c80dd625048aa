//go:build linux

// Package testbed builds throwaway network namespaces, veth pairs and bpffs
// mounts for tests, and removes them in t.Cleanup even when the test fails.
// It shells out to iproute2 (`ip`); tests may also run ethtool through
// NS.Run. Use only addresses inside the namespaces it creates. Root only.
package testbed

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	seq       atomic.Uint32
	sweepOnce sync.Once
)

// sweepStale deletes namespaces this package created in processes that no
// longer exist (a test binary killed before its cleanups ran). Only names
// of the form wp<pid>-<n>-<tag> with a dead pid are touched.
func sweepStale(t testing.TB) {
	ents, err := os.ReadDir("/var/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "wp")
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
			t.Logf("remove stale netns %s: %v: %s", e.Name(), err, out)
		}
	}
}

// RequireRoot skips t unless running as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, network namespaces)")
	}
}

// NS is a named network namespace (`ip netns`).
type NS struct {
	Name string
	t    testing.TB
}

// NewNS creates a namespace named wp<pid>-<n>-<tag>, brings its lo up, and
// deletes it in t.Cleanup.
func NewNS(t testing.TB, tag string) *NS {
	t.Helper()
	sweepOnce.Do(func() { sweepStale(t) })
	name := fmt.Sprintf("wp%d-%d-%s", os.Getpid(), seq.Add(1), tag)
	Cmd(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Logf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := &NS{Name: name, t: t}
	ns.Run("ip", "link", "set", "lo", "up")
	return ns
}

// Cmd runs a command and fails t on error; it returns the combined output.
func Cmd(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Run runs a command inside the namespace (`ip netns exec`).
func (n *NS) Run(args ...string) string {
	n.t.Helper()
	return Cmd(n.t, "ip", append([]string{"netns", "exec", n.Name}, args...)...)
}

// Sysctl sets key=value (e.g. net.ipv4.ip_forward=1) inside the namespace
// by writing /proc/sys from a thread in it (no sysctl binary needed).
func (n *NS) Sysctl(key, value string) {
	n.t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	if err := n.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) }); err != nil {
		n.t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Do runs fn on an OS thread switched into the namespace. Sockets created
// in fn stay in the namespace; so does BPF_PROG_TEST_RUN's fib lookup.
func (n *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer unix.Close(orig)
	target, err := unix.Open("/var/run/netns/"+n.Name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", n.Name, err)
	}
	ferr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime discards it at goroutine exit.
		return fmt.Errorf("leave netns %s: %w", n.Name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Ifindex returns the index of dev inside the namespace.
func (n *NS) Ifindex(dev string) int {
	n.t.Helper()
	var idx int
	err := n.Do(func() error {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		idx = iface.Index
		return nil
	})
	if err != nil {
		n.t.Fatalf("ifindex of %s in %s: %v", dev, n.Name, err)
	}
	return idx
}

// Veth creates a veth pair aName (in a) <-> bName (in b) with the given
// MAC addresses ("" = random) and brings both ends up. Deleting a namespace
// deletes its end; the pair goes with it.
func Veth(t testing.TB, a *NS, aName, aMAC string, b *NS, bName, bMAC string) {
	t.Helper()
	Cmd(t, "ip", "link", "add", aName, "netns", a.Name, "type", "veth", "peer", "name", bName, "netns", b.Name)
	if aMAC != "" {
		a.Run("ip", "link", "set", aName, "address", aMAC)
	}
	if bMAC != "" {
		b.Run("ip", "link", "set", bName, "address", bMAC)
	}
	a.Run("ip", "link", "set", aName, "up")
	b.Run("ip", "link", "set", bName, "up")
}

// BPFFS mounts a private bpffs on a temporary directory and returns it; it
// is unmounted in t.Cleanup. Pinned objects vanish with the mount.
func BPFFS(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
