package slowpath

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
)

// Recorder writes a sample of the proxied requests for `warmpath-bench analyze`:
// one JSON line per request in the Mooncake trace format (timestamp in ms
// since the first recorded request, input_length, output_length, hash_ids)
// plus "block_tokens" and "model". Prompts are never stored: hash_ids are the
// router's chained block hashes (equal leading ids = equal leading prompt
// bytes), and the partial last block gets an id of its own. output_length is
// not known to the router and is written as RecordOutputTokens.
//
// The ids in the file are not the router's hashes themselves but
// HMAC-SHA256 of each under a random key of the recorder's own, kept in
// memory only: equal hashes still give equal ids within the file, but
// nobody can test a guessed prompt against it (the router's hashes are
// unkeyed xxh3, computable by anyone).
//
// Recording is opt-in (`serve --record FILE`); it copies each event's hashes
// (allocates) and hands the line to a writer goroutine through a bounded
// queue, so a slow disk drops lines (counted) rather than delaying requests.
type Recorder struct {
	ch      chan recLine
	stop    chan struct{} // closed by Close; ch is never closed, so a late ObserveRouted is harmless
	done    chan struct{}
	left    atomic.Int64
	dropped atomic.Uint64
	written atomic.Uint64
	seq     atomic.Uint64
	first   atomic.Int64
	bt      int
	log     *slog.Logger
	f       *os.File
	err     error
	mac     hash.Hash // keyed; used by the writer goroutine only
	sum     []byte
}

// RecordOutputTokens is the output_length written for every recorded request.
const RecordOutputTokens = 256

type recLine struct {
	at     int64 // ns since the first recorded event
	tokens int
	model  string
	hashes []uint64
}

// NewRecorder creates (truncates) path and records up to limit requests.
// blockTokens is the router's hashing block (Router.HashConfig().BlockTokens).
func NewRecorder(path string, limit, blockTokens int, log *slog.Logger) (*Recorder, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("record: limit must be > 0, got %d", limit)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		f.Close()
		return nil, fmt.Errorf("record: key: %w", err)
	}
	r := &Recorder{ch: make(chan recLine, 4096), stop: make(chan struct{}), done: make(chan struct{}), bt: blockTokens, log: log, f: f,
		mac: hmac.New(sha256.New, key)}
	r.left.Store(int64(limit))
	go r.write()
	return r, nil
}

// ObserveRouted records ev if the sample is not complete yet.
func (r *Recorder) ObserveRouted(ev *RoutedEvent) {
	if ev.PromptTokens <= 0 || len(ev.Hashes) == 0 || r.left.Add(-1) < 0 {
		return
	}
	r.first.CompareAndSwap(0, ev.Start)
	l := recLine{at: ev.Start - r.first.Load(), tokens: ev.PromptTokens, model: string(ev.Model)}
	blocks := (ev.PromptTokens + r.bt - 1) / r.bt
	l.hashes = make([]uint64, 0, max(blocks, len(ev.Hashes)))
	l.hashes = append(l.hashes, ev.Hashes...)
	// the partial tail block (and any blocks past the hashed bytes) are this
	// request's own: ids no other request shares
	for len(l.hashes) < blocks {
		l.hashes = append(l.hashes, tailID(ev.Hashes[len(ev.Hashes)-1], r.seq.Add(1), len(l.hashes)))
	}
	l.hashes = l.hashes[:blocks]
	select {
	case r.ch <- l:
	default:
		r.dropped.Add(1)
	}
}

// keyed is the id written for hash h: the first 8 bytes of its HMAC.
func (r *Recorder) keyed(h uint64) uint64 {
	var in [8]byte
	binary.LittleEndian.PutUint64(in[:], h)
	r.mac.Reset()
	r.mac.Write(in[:])
	r.sum = r.mac.Sum(r.sum[:0])
	return binary.LittleEndian.Uint64(r.sum)
}

func tailID(last, seq uint64, i int) uint64 {
	x := last ^ seq*0x9e3779b97f4a7c15 ^ uint64(i)<<48
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return x
}

func (r *Recorder) write() {
	defer close(r.done)
	w := bufio.NewWriter(r.f)
	var b []byte
	put := func(l recLine) {
		for i, h := range l.hashes {
			l.hashes[i] = r.keyed(h)
		}
		b = appendRecord(b[:0], &l, r.bt)
		if _, err := w.Write(b); err != nil && r.err == nil {
			r.err = err
		}
		r.written.Add(1)
	}
	flush := func() {
		if err := w.Flush(); err != nil && r.err == nil {
			r.err = err
		}
	}
	for {
		select {
		case l := <-r.ch:
			put(l)
			if len(r.ch) == 0 {
				flush()
			}
		case <-r.stop:
			for {
				select {
				case l := <-r.ch:
					put(l)
				default:
					flush()
					return
				}
			}
		}
	}
}

func appendRecord(b []byte, l *recLine, blockTokens int) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendFloat(b, float64(l.at)/1e6, 'f', 3, 64)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(l.tokens), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, RecordOutputTokens, 10)
	b = append(b, `, "block_tokens": `...)
	b = strconv.AppendInt(b, int64(blockTokens), 10)
	b = append(b, `, "model": `...)
	b = strconv.AppendQuote(b, l.model)
	b = append(b, `, "hash_ids": [`...)
	for i, h := range l.hashes {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, h, 10)
	}
	return append(b, "]}\n"...)
}

// Close stops recording, flushes and closes the file. It reports the first
// write error, and logs how many lines were written and dropped.
func (r *Recorder) Close() error {
	r.left.Store(-1 << 62)
	close(r.stop)
	<-r.done
	if err := r.f.Close(); err != nil && r.err == nil {
		r.err = err
	}
	if r.log != nil {
		r.log.Info("request sample recorded", "file", r.f.Name(), "lines", r.written.Load(), "dropped", r.dropped.Load())
	}
	return r.err
}

// Observers fans a RoutedEvent out to several observers, in order; nil
// entries are skipped.
type Observers []Observer

// ObserveRouted calls every observer.
func (os Observers) ObserveRouted(ev *RoutedEvent) {
	for _, o := range os {
		if o != nil {
			o.ObserveRouted(ev)
		}
	}
}

var (
	_ Observer = (*Recorder)(nil)
	_ Observer = Observers(nil)
)
