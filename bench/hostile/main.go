// Command hostile reproduces the hostile-input figures of
// docs/reliability.md against a running `warmpath serve`:
//
//	hostile engine -addr A -size N [-content-length] [-metrics-size N]
//	    an engine answering every completion with an N-byte JSON body
//	    (chunked, or with Content-Length) and /metrics with an N-byte
//	    comment, for the huge-answer and huge-metrics rows;
//	hostile flood -addr A -n N [-model M]
//	    opens N idle connections to the router, waits, reports how many it
//	    still holds and how many the router refused, then sends one chat
//	    request (the connection-flood row; run the router under ulimit -n).
//
// It is a measuring tool, not a test: nothing here asserts.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hostile engine|flood [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "engine":
		err = engine(os.Args[2:])
	case "flood":
		err = flood(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

// fill is an io.Reader of n bytes of 'a'.
type fill struct{ left int64 }

func (f *fill) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), f.left)
	for i := range p[:n] {
		p[i] = 'a'
	}
	f.left -= n
	return int(n), nil
}

func engine(args []string) error {
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:18100", "listen `address`")
	size := fs.Int64("size", 2<<30, "bytes of each completion's content")
	cl := fs.Bool("content-length", false, "send Content-Length (else chunked)")
	msize := fs.Int64("metrics-size", 0, "bytes of padding in /metrics")
	if err := fs.Parse(args); err != nil {
		return err
	}
	const head, tail = `{"choices":[{"message":{"content":"`, `"}}],"usage":{"prompt_tokens":1}}`
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n# ") //nolint:errcheck
		io.Copy(w, &fill{*msize})                                                         //nolint:errcheck
		io.WriteString(w, "\n")                                                           //nolint:errcheck
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if *cl {
			w.Header().Set("Content-Length", strconv.FormatInt(*size+int64(len(head)+len(tail)), 10))
		}
		io.WriteString(w, head)  //nolint:errcheck
		io.Copy(w, &fill{*size}) //nolint:errcheck
		io.WriteString(w, tail)  //nolint:errcheck
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func flood(args []string) error {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "router `address`")
	n := fs.Int("n", 1100, "idle connections to open")
	model := fs.String("model", "demo-llama-8b", "model of the request sent after")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var conns []net.Conn
	dialFailed := 0
	for range *n {
		c, err := net.DialTimeout("tcp", *addr, 2*time.Second)
		if err != nil {
			dialFailed++
			continue
		}
		conns = append(conns, c)
	}
	time.Sleep(1500 * time.Millisecond)
	held, refused := 0, 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		b := make([]byte, 16)
		k, err := c.Read(b)
		var ne net.Error
		switch {
		case k > 0 && bytes.HasPrefix(b[:k], []byte("HTTP/1.1 503")):
			refused++ // answered too_many_connections and closed
		case err != nil && !(errors.As(err, &ne) && ne.Timeout()):
			refused++ // closed
		default:
			held++ // silent: still open
		}
	}
	body := `{"model":"` + *model + `","messages":[{"role":"user","content":"hi"}]}`
	status := "no answer"
	if c, err := net.DialTimeout("tcp", *addr, 2*time.Second); err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			status = resp.Status
		}
		c.Close()
	} else {
		status = err.Error()
	}
	fmt.Printf("dialed=%d dial_failed=%d held_open=%d refused_by_router=%d request_after=%q\n", *n, dialFailed, held, refused, status)
	for _, c := range conns {
		c.Close()
	}
	return nil
}
