package child

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// OnStart, when set (tests), is told every child's pid (= its process
// group). Set it before starting anything and clear it after.
var OnStart func(pid int)

// OnBindRetry, when set (tests), is called each time RetryBind starts again
// after a child lost its port: that child was started and told to OnStart,
// and another takes its place. Set and cleared like OnStart.
var OnBindRetry func()

// Proc is one child process in its own process group; Stop kills the group.
// Safe for concurrent use.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *Tail
	done chan struct{} // closed when Wait returned
	err  error         // Wait's error, valid after done
	once sync.Once
}

// Start starts bin in a new process group (so Stop reaches its children,
// e.g. nginx workers) that dies with the runner (Pdeathsig).
func Start(name, bin string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	p := &Proc{Name: name, cmd: cmd, out: &Tail{Max: 8 << 10}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipe cannot block Wait
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	if OnStart != nil {
		OnStart(cmd.Process.Pid)
	}
	return p, nil
}

// Pid is the process id, which is also its process group id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Output is the last 8 KiB of the process's stdout and stderr.
func (p *Proc) Output() string { return p.out.String() }

// Exited reports whether the process ended (and how) without blocking.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process. Safe to call more than once.
func (p *Proc) Stop(grace time.Duration) {
	p.once.Do(func() {
		pid := p.Pid()
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

// Failure describes a process that died, with the end of its output; nil
// while it runs.
func (p *Proc) Failure() error {
	if ok, err := p.Exited(); ok {
		return fmt.Errorf("%s exited (%v): %s", p.Name, err, p.out.String())
	}
	return nil
}

// Tail keeps the last Max bytes written to it. Safe for concurrent use.
type Tail struct {
	mu  sync.Mutex
	Max int
	b   []byte
}

func (t *Tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if over := len(t.b) - t.Max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(b), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago. The port is released before the child binds it; a lost race shows as
// a child that exits at start-up, which WaitReady reports.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// RetryBind runs start, which picks its ports with FreeAddr, up to three
// times while it fails because a port was taken: between FreeAddr closing
// its listener and the child binding the port, any other process on the
// machine (a parallel test, a client's ephemeral port) can take it.
func RetryBind(start func() error) error {
	var err error
	for i := range 3 {
		if i > 0 && OnBindRetry != nil {
			OnBindRetry()
		}
		if err = start(); !BindLost(err) {
			return err
		}
	}
	return err
}

// BindLost reports whether err (a child's start-up failure, its output
// included) says the child could not bind its port: Go's and nginx's
// "address already in use", llama-server's "couldn't bind HTTP server
// socket".
func BindLost(err error) bool {
	if err == nil {
		return false
	}
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "address already in use") || strings.Contains(s, "couldn't bind")
}

// WaitReady polls GET url until it answers 200, the process dies, ctx ends
// or timeout passes.
func WaitReady(ctx context.Context, p *Proc, url string, timeout time.Duration) error {
	return WaitReadyAuth(ctx, p, url, "", timeout)
}

// WaitReadyAuth is WaitReady sending key as a bearer token ("" = none).
func WaitReadyAuth(ctx context.Context, p *Proc, url, key string, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := p.Failure(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
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
	return fmt.Errorf("%s not ready at %s after %v: %v; output: %s", p.Name, url, timeout, last, p.out.String())
}

// Group is a set of running processes stopped together. Not safe for
// concurrent use.
type Group struct{ Procs []*Proc }

// Add adds p to the group.
func (g *Group) Add(p *Proc) { g.Procs = append(g.Procs, p) }

// Stop stops every process (in parallel: each may wait its grace period).
func (g *Group) Stop() {
	var wg sync.WaitGroup
	for _, p := range g.Procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop(3 * time.Second) }()
	}
	wg.Wait()
	g.Procs = nil
}

// Failure is the first member's Failure, or nil when all run.
func (g *Group) Failure() error {
	for _, p := range g.Procs {
		if err := p.Failure(); err != nil {
			return err
		}
	}
	return nil
}
