package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	args := []string{"--listen", "127.0.0.1:0", "--served-model-name", "a,b", "--served-model-name", "c",
		"--lora-modules", "l1=/x", "--time-scale", "0.01", "--num-gpu-blocks-override", "100", "--log-level", "warn"}
	go func() { done <- run(ctx, args, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/v1/models")
	if err != nil {
		t.Fatalf("models: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`"a"`, `"b"`, `"c"`, `"l1"`} {
		if !strings.Contains(string(body), m) {
			t.Errorf("model %s missing: %s", m, body)
		}
	}
	resp, err = c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `num_gpu_blocks="100"`) {
		t.Errorf("--num-gpu-blocks-override not applied:\n%s", body)
	}
	c.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--gpu", "h100"}, "flag provided but not defined"},
		{"bad int", []string{"--block-size", "x"}, "invalid value"},
		{"invalid config", []string{"--block-size", "0"}, "BlockSize"},
		{"bad time scale", []string{"--time-scale", "-1"}, "TimeScale"},
		{"bad log level", []string{"--log-level", "loud"}, "log-level"},
		{"positional", []string{"serve"}, "unexpected arguments"},
		{"listen", []string{"--listen", "256.0.0.1:1"}, "listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run(%v) = %v, want error containing %q", tc.args, err, tc.want)
			}
		})
	}
}
