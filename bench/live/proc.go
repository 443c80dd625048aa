package live

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// onStart, when set (tests), is told every child's pid (= its process group).
var onStart func(pid int)

// proc is one child process in its own process group; stop kills the group.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *tail
	done chan struct{} // closed when Wait returned
	err  error         // Wait's error, valid after done
	once sync.Once
}

// startProc starts bin in a new process group (so stop reaches its
// children, e.g. nginx workers) that dies with the runner (Pdeathsig).
func startProc(name, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	p := &proc{name: name, cmd: cmd, out: &tail{max: 8 << 10}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipe cannot block Wait
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	if onStart != nil {
		onStart(cmd.Process.Pid)
	}
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process ended (and how) without blocking.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process. Safe to call more than once.
func (p *proc) stop(grace time.Duration) {
	p.once.Do(func() {
		pid := p.pid()
		_ = killGroup(pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
		// The group may hold children even after the leader exited.
		_ = killGroup(pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
	})
}

// failure describes a process that died, with the end of its output.
func (p *proc) failure() error {
	if ok, err := p.exited(); ok {
		return fmt.Errorf("%s exited (%v): %s", p.name, err, p.out.String())
	}
	return nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// freeAddr returns a loopback address with a port that was free a moment
// ago. The port is released before the child binds it; a lost race shows as
// a child that exits at start-up, which waitReady reports.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// waitReady polls GET url until it answers 200, the process dies, ctx ends or
// timeout passes.
func waitReady(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := p.failure(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready at %s after %v: %v; output: %s", p.name, url, timeout, last, p.out.String())
}

// group is a set of running processes stopped together.
type group struct{ procs []*proc }

func (g *group) add(p *proc) { g.procs = append(g.procs, p) }

// stop stops every process (in parallel: each may wait its grace period).
func (g *group) stop() {
	var wg sync.WaitGroup
	for _, p := range g.procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(3 * time.Second) }()
	}
	wg.Wait()
	g.procs = nil
}

// buildBinaries builds cmd/warmpath and cmd/enginesim into dir with the go
// tool, from the module that contains the working directory.
func buildBinaries(ctx context.Context, dir string) (warmpath, enginesim string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", errors.New("build: no go tool in PATH; pass Options.WarmpathBin and Options.EnginesimBin")
	}
	warmpath, enginesim = filepath.Join(dir, "warmpath"), filepath.Join(dir, "enginesim")
	for _, b := range []struct{ out, pkg string }{
		{warmpath, "github.com/warmpath/warmpath/cmd/warmpath"},
		{enginesim, "github.com/warmpath/warmpath/cmd/enginesim"},
	} {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", b.out, b.pkg)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return "", "", fmt.Errorf("go build %s (run inside the warmpath module, or pass the binary paths): %w: %s", b.pkg, err, out)
		}
	}
	return warmpath, enginesim, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
