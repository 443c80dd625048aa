package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// demoModel is the model name the demo engines serve.
const demoModel = "demo-llama-8b"

// demoEngines is how many simulated engines --demo starts.
const demoEngines = 3

func demoCurl(hostport string) string {
	return "curl -sN http://" + hostport + "/v1/chat/completions -H 'Content-Type: application/json' -d '" +
		`{"model":"` + demoModel + `","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say hello."}]}` + "'"
}

// startDemoEngines starts the simulated engines on loopback ephemeral ports,
// 20x faster than life.
func startDemoEngines(log *slog.Logger, admin bool) ([]*enginesim.Server, error) {
	var out []*enginesim.Server
	quiet := log
	for i := range demoEngines {
		c := enginesim.DefaultConfig()
		c.ServedModelNames = []string{demoModel}
		c.TimeScale = 0.05
		c.Seed = uint64(i + 1)
		c.Logger = quiet
		c.OutputLen.Median = 40
		c.OutputLen.Max = 256
		c.EnableAdmin = admin
		en, err := enginesim.Start(c, "127.0.0.1:0")
		if err != nil {
			_ = closeEngines(out)
			return nil, fmt.Errorf("start demo engine %d: %w", i, err)
		}
		out = append(out, en)
	}
	addrs := make([]string, len(out))
	for i, en := range out {
		addrs[i] = en.Addr()
	}
	log.Info("demo engines started", "model", demoModel, "addrs", strings.Join(addrs, ","))
	return out, nil
}

// closeEngines closes every engine, joining their errors.
func closeEngines(engines []*enginesim.Server) error {
	var errs []error
	for _, en := range engines {
		errs = append(errs, en.Close())
	}
	return errors.Join(errs...)
}
