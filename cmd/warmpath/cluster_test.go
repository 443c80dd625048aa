package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/slowpath/cluster/natstest"
)

// TestServeClusterFlags: two `warmpath serve --nats URL --instance NAME`
// runs against an in-process NATS server find each other: each reports
// itself connected and one peer seen on /metrics and /debug/replicas.
func TestServeClusterFlags(t *testing.T) {
	url := natstest.URL(natstest.Start(t, nil))

	var runs []*started
	for _, name := range []string{"edge-a", "edge-b"} {
		runs = append(runs, startServe(t, "--demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
			"--log-level", "warn", "--nats", url, "--instance", name))
	}
	for i, st := range runs {
		var m string
		for range 400 {
			m = scrape(t, "http://"+st.admin+"/metrics")
			if strings.Contains(m, "warmpath_cluster_connected 1") && strings.Contains(m, "warmpath_cluster_peers_seen 1") {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !strings.Contains(m, "warmpath_cluster_connected 1") || !strings.Contains(m, "warmpath_cluster_peers_seen 1") {
			t.Fatalf("run %d: not connected with one peer after 4s:\n%s", i, grepLines(m, "warmpath_cluster_"))
		}
		var dbg struct {
			Cluster struct {
				Instance  string   `json:"instance"`
				Connected bool     `json:"connected"`
				Peers     []string `json:"peers"`
			} `json:"cluster"`
		}
		getJSON(t, "http://"+st.admin+"/debug/replicas", &dbg)
		self, other := "edge-a", "edge-b"
		if i == 1 {
			self, other = other, self
		}
		if c := dbg.Cluster; c.Instance != self || !c.Connected || len(c.Peers) != 1 || c.Peers[0] != other {
			t.Fatalf("run %d: /debug/replicas cluster = %+v, want %s connected with peer %s", i, c, self, other)
		}
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := testClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
