//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// procCPU returns the user and system CPU time of pid (all threads), from
// /proc/<pid>/stat, in clock ticks converted at 100 Hz.
func procCPU(tb testing.TB, pid int) (user, sys time.Duration) {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the ")" of the command name: state is field 3; utime
	// and stime are fields 14 and 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}

// BenchmarkPromotedClients: one promoted client's requests through the VIP
// with the fast path (kernel mode: steered to the warm GPU host, the edge's
// warmpath process not involved) and the same requests forced through the
// slowpath (the same edge in userspace mode), side by side. 8 workers, one
// keep-alive connection each, non-streamed chat completions of 4 tokens
// with a ~600-token shared prompt. Reports requests/s and the edge
// warmpath process's CPU (user + system) per request; kernel time spent
// in XDP/softirq is not attributed to the process and not in these
// numbers. Root only (network namespaces, XDP).
//
//	sudo go test -run '^$' -bench PromotedClients -benchtime=3000x -count=3 ./cmd/warmpath
func BenchmarkPromotedClients(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (BPF, network namespaces)")
	}
	bed := newE2EBed(b, 64)
	body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"same question"}]}`, e2eSystem)

	const workers = 8
	load := func(b *testing.B, proc *edgeProc, wantSteered bool) {
		clients := make([]*http.Client, workers)
		for i := range clients {
			clients[i] = nsClient(bed.cli, e2eClient, true)
		}
		post := func(c *http.Client) error {
			resp, err := c.Post("http://"+e2eVIP.String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}
		// Promotion (kernel mode) and connection warm-up: requests on new
		// connections until the entry exists, then one request per worker.
		promoteClient := nsClient(bed.cli, e2eClient, false)
		for range 6 {
			if err := post(promoteClient); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(200 * time.Millisecond)
		for _, c := range clients {
			if err := post(c); err != nil {
				b.Fatal(err)
			}
		}
		slow0 := bed.slowpathRequests()
		u0, s0 := procCPU(b, proc.cmd.Process.Pid)
		var next atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		b.ResetTimer()
		start := time.Now()
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					if post(c) != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		b.StopTimer()
		u1, s1 := procCPU(b, proc.cmd.Process.Pid)
		if failed.Load() > 0 {
			b.Fatalf("%d requests failed", failed.Load())
		}
		through := bed.slowpathRequests() - slow0
		if wantSteered && through > 0 || !wantSteered && through < float64(b.N) {
			b.Fatalf("slowpath saw %v of %d requests (steered run: %v)", through, b.N, wantSteered)
		}
		cpu := (u1 - u0) + (s1 - s0)
		b.ReportMetric(float64(b.N)/el.Seconds(), "req/s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "edge-cpu-µs/req")
		b.ReportMetric(100*cpu.Seconds()/el.Seconds(), "edge-cpu-%")
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}

	proc := bed.startEdge(bed.config("kernel"))
	b.Run("path=fast", func(b *testing.B) { load(b, proc, true) })
	proc.kill()
	// Forced through the slowpath: no XDP at all (detach), userspace mode.
	if err := bed.edge.Do(func() error {
		return run(context.Background(), []string{"detach", "--pin-path", filepath.Join(bed.bpffs, "edge")}, env{stdout: io.Discard, stderr: io.Discard})
	}); err != nil {
		b.Fatal(err)
	}
	proc = bed.startEdge(bed.config("userspace"))
	b.Run("path=slow", func(b *testing.B) { load(b, proc, false) })
}
