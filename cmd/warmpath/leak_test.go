package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
)

// TestMain fails the package if serve leaves goroutines behind after its
// context ends or SIGTERM. fasthttp's process-wide and self-terminating
// helpers are expected.
//
// With WARMPATH_E2E_CHILD=1 the test binary is warmpath itself (os.Args[1:]
// are warmpath's arguments): the end-to-end test runs the edge's warmpath
// as a child process in a network namespace and kills it with SIGKILL.
// childEnv makes the test binary run warmpath itself (see TestMain).
const childEnv = "WARMPATH_E2E_CHILD"

// childNATSEnv makes the test binary an embedded NATS server listening on
// the address it names (the fleet end-to-end test runs one in a network
// namespace; the library's listener must be opened there, by a process).
const childNATSEnv = "WARMPATH_E2E_NATS"

func TestMain(m *testing.M) {
	if addr := os.Getenv(childNATSEnv); addr != "" {
		os.Exit(runNATSChild(addr))
	}
	if os.Getenv(childEnv) == "1" {
		err := run(context.Background(), os.Args[1:], stdEnv())
		switch {
		case errors.Is(err, errUsage):
			os.Exit(2)
		case err != nil:
			fmt.Fprintln(os.Stderr, "warmpath:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}

// runNATSChild serves NATS on addr (host:port) until killed.
func runNATSChild(addr string) int {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats child:", err)
		return 2
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats child:", err)
		return 2
	}
	ns, err := server.NewServer(&server.Options{Host: host, Port: p, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats child:", err)
		return 1
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats child: not ready")
		return 1
	}
	fmt.Println("nats ready")
	ns.WaitForShutdown()
	return 0
}
