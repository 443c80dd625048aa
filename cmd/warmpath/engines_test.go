package main

import (
	"log/slog"
	"testing"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// startEngines starts n quiet enginesim engines serving model "m" on
// loopback ephemeral ports, closed at the test's end; set adjusts engine
// i's config before it starts.
func startEngines(t *testing.T, n int, set func(i int, c *enginesim.Config)) []*enginesim.Server {
	t.Helper()
	var out []*enginesim.Server
	for i := range n {
		c := enginesim.DefaultConfig()
		c.ServedModelNames = []string{"m"}
		c.Logger = slog.New(slog.DiscardHandler)
		set(i, &c)
		en, err := enginesim.Start(c, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { en.Close() })
		out = append(out, en)
	}
	return out
}
