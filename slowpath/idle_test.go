package slowpath

import (
	"strings"
	"testing"
	"time"
)

func TestIdleTimeoutConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       time.Duration
		err        string
	}{
		{name: "default", yaml: "listen: :8080", want: 60 * time.Second},
		{name: "set", yaml: "upstream:\n  idle_timeout: 5s", want: 5 * time.Second},
		{name: "zero", yaml: "upstream:\n  idle_timeout: 0s", err: "upstream.idle_timeout: must be > 0, got 0s"},
		{name: "negative", yaml: "upstream:\n  idle_timeout: -1s", err: "upstream.idle_timeout: must be > 0, got -1s"},
		{name: "misspelt", yaml: "upstream:\n  idle_timout: 5s", err: "field idle_timout not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Upstream.IdleTimeout != tc.want {
				t.Fatalf("idle_timeout %s, want %s", c.Upstream.IdleTimeout, tc.want)
			}
		})
	}
}
