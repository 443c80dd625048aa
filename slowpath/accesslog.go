package slowpath

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// accessLog writes one line per request (log.access): proxied requests when
// they complete (a stream: after its last byte) and the router's own error
// answers. A line holds the time, client address, model, replica, status,
// TTFT, the engine's prompt/output/cached token counts and the duration;
// never the prompt, the body or any header value. Lines go through a
// bounded queue to a writer goroutine, so a slow disk drops lines (counted)
// instead of delaying requests.
type accessLog struct {
	ch      chan accessLine
	stop    chan struct{} // closed by close; ch is never closed, a late line is harmless
	done    chan struct{}
	log     *slog.Logger
	closer  io.Closer // the file, or nil for stderr/stdout
	dropped prometheus.Counter
	once    sync.Once
}

type accessLine struct {
	at       time.Time
	client   netip.AddrPort
	model    string
	replica  string
	code     string // the router's error code for its own answers
	status   int
	ttft     time.Duration // < 0 = none
	duration time.Duration
	prompt   int // -1 = not reported
	output   int
	cached   int
	// What the router expected when it chose the replica; predTTFT 0 (and
	// predCached -1) when it made no prediction (the router's own answers).
	predCached int
	predTTFT   time.Duration
	busy       int
	held       time.Duration // waited at the router for a busy slot; 0 = not held
	// The slot holds slept through, the last one's replica, end, promise,
	// predicted wait and gain (RoutedEvent.Holds, HeldOn, HoldEnd,
	// HoldPromised, HoldWait, HoldGain); holds 0 = none.
	holds, promised    int
	holdWait, holdGain time.Duration
	heldOn, holdEnd    string
	// The engine's reported prefill (RoutedEvent.EnginePrefillTokens and
	// EnginePrefillSeconds); engPrefill 0 = not reported.
	engTokens  int
	engPrefill time.Duration
}

// openAccessLog opens the destination of log.access (see LogConfig) and
// starts the writer. format is log.format.
func openAccessLog(dest, format string, dropped prometheus.Counter) (*accessLog, error) {
	var w io.Writer
	var closer io.Closer
	switch dest {
	case "true", "stderr":
		w = os.Stderr
	case "stdout":
		w = os.Stdout
	default:
		f, err := os.OpenFile(dest, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, fieldErrorf("log.access", "%w", err)
		}
		w, closer = f, f
	}
	a := &accessLog{ch: make(chan accessLine, 4096), stop: make(chan struct{}), done: make(chan struct{}),
		log: slog.New(NewLogHandler(w, format, slog.LevelInfo)), closer: closer, dropped: dropped}
	go a.write()
	return a, nil
}

// NewLogHandler is the slog handler of a log format (LogFormatText or
// LogFormatJSON) writing to w.
func NewLogHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	o := &slog.HandlerOptions{Level: level}
	if format == LogFormatJSON {
		return slog.NewJSONHandler(w, o)
	}
	return slog.NewTextHandler(w, o)
}

func (a *accessLog) push(l accessLine) {
	select {
	case a.ch <- l:
	default:
		a.dropped.Inc()
	}
}

// routed queues a proxied request's line.
func (a *accessLog) routed(ev *RoutedEvent) {
	l := accessLine{at: time.Now(), client: ev.Client, model: string(ev.Model), replica: ev.Replica, status: ev.Status,
		ttft: -1, duration: time.Duration(ev.End - ev.Arrival), prompt: ev.ReportedPromptTokens, output: ev.OutputTokens, cached: ev.CachedTokens,
		predCached: ev.PredictedCachedTokens, predTTFT: time.Duration(ev.PredictedTTFT * 1e9), busy: ev.BusyAtStart,
		engTokens: ev.EnginePrefillTokens, engPrefill: time.Duration(ev.EnginePrefillSeconds * 1e9), held: time.Duration(ev.Held),
		holds: ev.Holds, heldOn: ev.HeldOn, holdEnd: ev.HoldEnd, promised: ev.HoldPromised,
		holdWait: time.Duration(ev.HoldWait * 1e9), holdGain: time.Duration(ev.HoldGain * 1e9)}
	if ev.FirstToken > 0 {
		l.ttft = time.Duration(ev.FirstToken - ev.Arrival)
	}
	if !ev.OK {
		l.code = "incomplete" // broken stream, or the client left mid-answer
	}
	a.push(l)
}

// local queues the line of an answer the router made itself.
func (a *accessLog) local(ctx *fasthttp.RequestCtx, status int, code string) {
	l := accessLine{at: time.Now(), status: status, code: code, ttft: -1, prompt: -1, output: -1, cached: -1, replica: "none", predCached: -1}
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		l.client = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	l.duration = l.at.Sub(ctx.Time())
	a.push(l)
}

func (a *accessLog) write() {
	defer close(a.done)
	for {
		select {
		case l := <-a.ch:
			a.line(&l)
		case <-a.stop:
			for {
				select {
				case l := <-a.ch:
					a.line(&l)
				default:
					return
				}
			}
		}
	}
}

func (a *accessLog) line(l *accessLine) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String("client", l.client.String()), slog.String("model", l.model),
		slog.String("replica", l.replica), slog.Int("status", l.status))
	if l.code != "" {
		attrs = append(attrs, slog.String("error", l.code))
	}
	if l.ttft >= 0 {
		attrs = append(attrs, slog.Float64("ttft_ms", ms(l.ttft)))
	}
	for _, t := range []struct {
		k string
		v int
	}{{"prompt_tokens", l.prompt}, {"output_tokens", l.output}, {"cached_tokens", l.cached}} {
		if t.v >= 0 {
			attrs = append(attrs, slog.Int(t.k, t.v))
		}
	}
	if l.predTTFT > 0 {
		attrs = append(attrs, slog.Float64("predicted_ttft_ms", ms(l.predTTFT)), slog.Int("predicted_cached_tokens", l.predCached),
			slog.Int("busy_at_start", l.busy))
	}
	if l.held > 0 {
		attrs = append(attrs, slog.Float64("held_ms", ms(l.held)))
	}
	if l.holds > 0 {
		attrs = append(attrs, slog.Int("holds", l.holds), slog.String("held_on", l.heldOn), slog.String("hold_end", l.holdEnd),
			slog.Int("hold_promised_tokens", l.promised), slog.Float64("hold_wait_ms", ms(l.holdWait)), slog.Float64("hold_gain_ms", ms(l.holdGain)))
	}
	if l.engPrefill > 0 {
		attrs = append(attrs, slog.Int("engine_prefill_tokens", l.engTokens), slog.Float64("engine_prefill_ms", ms(l.engPrefill)))
	}
	attrs = append(attrs, slog.Float64("duration_ms", ms(l.duration)))
	r := slog.NewRecord(l.at, slog.LevelInfo, "request", 0)
	r.AddAttrs(attrs...)
	_ = a.log.Handler().Handle(context.Background(), r)
}

// close drains the queue and closes the file.
func (a *accessLog) close() {
	a.once.Do(func() {
		close(a.stop)
		<-a.done
		if a.closer != nil {
			_ = a.closer.Close()
		}
	})
}
