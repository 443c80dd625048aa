package sim

import "testing"

// TestCostMeetsStepPhase: one-company on 8 default vLLM engines, where
// every engine holds the one instruction prompt after the first burst and
// each request computes a few dozen tokens: its TTFT is mostly the wait
// for the engine's running step to end. Least-request, and the cost policy
// without the step clock, send a request more often than chance to the
// engine that has just ended a stream, where a step has just begun, and
// fall behind round-robin (seed 1, half of capacity: cost without the
// clock 0.0281 s, round-robin 0.0269 s); with the clock the cost policy
// sends it where the step ends first and is ahead (0.0264 s).
func TestCostMeetsStepPhase(t *testing.T) {
	run := oneCompanyOn8(t)
	rps := 0.5 * run("least-request", 1e6, Config{}).RequestsPerSec
	cost, blind, rr := run("cost", rps, Config{}), run("cost", rps, Config{NoStepClock: true}), run("round-robin", rps, Config{})
	t.Logf("mean TTFT: cost %.4fs, cost without the step clock %.4fs, round-robin %.4fs", cost.TTFT.Mean, blind.TTFT.Mean, rr.TTFT.Mean)
	if cost.TTFT.Mean > rr.TTFT.Mean {
		t.Errorf("cost mean TTFT %.4fs above round-robin's %.4fs", cost.TTFT.Mean, rr.TTFT.Mean)
	}
	if cost.TTFT.Mean >= blind.TTFT.Mean {
		t.Errorf("cost mean TTFT %.4fs with the step clock, %.4fs without: no gain", cost.TTFT.Mean, blind.TTFT.Mean)
	}
}
