package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeSignalsDuringStartup: a SIGHUP as soon as serve says anything
// (its first log line, while it still starts its engines and listeners)
// neither kills it nor is lost: serve comes up, reloads, and a SIGTERM
// then stops it cleanly (exit 0). Go's default action for an unhandled
// SIGHUP kills the process, so the handler must come before the listeners.
func TestServeSignalsDuringStartup(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "serve", "--demo", "--listen", "127.0.0.1:0", "--admin", "")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
		done <- cmd.Wait()
	}()
	timeout := time.After(30 * time.Second) // hang guard
	first := true
	for serving := false; !serving; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve ended during startup: %v", <-done)
			}
			if first {
				first = false
				if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
					t.Fatal(err)
				}
			}
			serving = strings.Contains(l, "warmpath serving")
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatal("serve did not come up")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines {
		}
	}()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("serve exited %v (a signal during startup killed it?)", ee)
		}
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("serve did not stop on SIGTERM")
	}
}
