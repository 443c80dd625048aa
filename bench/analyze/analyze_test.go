package analyze

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

func TestRecommendations(t *testing.T) {
	sp := workload.DefaultSharedPrefix()
	sp.Groups, sp.PromptsPerGroup, sp.RPS = 16, 8, 40
	shared, _ := workload.SharedPrefix(sp)
	ns := workload.DefaultNoSharing()
	ns.Requests = 100
	none, _ := workload.NoSharing(ns)
	tests := []struct {
		name     string
		w        *workload.Workload
		want     string
		minShare float64
		maxShare float64
	}{
		{"shared prefix", shared, "Yes", 0.8, 0.95},
		{"no sharing", none, "No", 0, 0.001},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Analyze(tt.w, Options{Replicas: 4})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(r.Recommendation, tt.want) {
				t.Fatalf("recommendation %q, want %q...", r.Recommendation, tt.want)
			}
			if r.ReusableShare < tt.minShare || r.ReusableShare > tt.maxShare {
				t.Fatalf("reusable share %.3f", r.ReusableShare)
			}
			for i := 1; i < len(r.Curve); i++ {
				if r.Curve[i].Share < r.Curve[i-1].Share || r.Curve[i].Share > r.ReusableShare+1e-9 {
					t.Fatalf("curve not monotone or above the unbounded share: %+v", r.Curve)
				}
			}
			var b bytes.Buffer
			r.WriteText(&b)
			if !strings.Contains(b.String(), "recommendation:") {
				t.Fatal("text report lacks the recommendation")
			}
		})
	}
}

func TestSmallCacheLosesReuse(t *testing.T) {
	b2b := workload.B2BSaaS()
	w, _ := workload.SharedPrefix(b2b)
	r, err := Analyze(w, Options{Replicas: 2, CacheTokens: []int{4000, 1 << 22}, SkipSimulation: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Curve[0].Share >= r.Curve[1].Share/2 {
		t.Fatalf("a cache smaller than one prefix kept %.3f of %.3f", r.Curve[0].Share, r.Curve[1].Share)
	}
	if r.GroupsFor80 < 100 || r.TopGroups[0].Requests != 5 {
		t.Fatalf("groups: %d hold 80%%, top %+v", r.GroupsFor80, r.TopGroups[0])
	}
}

func TestReadRequests(t *testing.T) {
	sp := workload.DefaultSharedPrefix()
	sp.Groups, sp.PromptsPerGroup = 3, 4
	w, _ := workload.SharedPrefix(sp)
	var in bytes.Buffer
	for i := range w.Requests {
		body := workload.AppendChatBody(nil, &w.Requests[i], false)
		// add a timestamp field in milliseconds
		fmt.Fprintf(&in, "{\"timestamp\": %d, %s\n", w.Requests[i].Arrival/1e6, body[1:])
	}
	in.WriteString(`{"model":"m","prompt":"hello world, a completion"}` + "\n")
	got, err := ReadRequests(&in)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Requests) != 13 {
		t.Fatalf("got %d requests", len(got.Requests))
	}
	reuse, total := workload.Reuse(got)
	if share := float64(reuse) / float64(total); share < 0.6 {
		t.Fatalf("shared prefixes lost in conversion: share %.3f", share)
	}
	for _, bad := range []struct{ in, want string }{
		{"{", "line 1"},
		{`{"model":"m","messages":"x"}`, "line 1"},
		{"", "no requests"},
	} {
		if _, err := ReadRequests(strings.NewReader(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("input %q: got %v, want %q", bad.in, err, bad.want)
		}
	}
}
